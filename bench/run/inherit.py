"""A suite that extends another: `extends = "core"` joins the base suite's evaluation with rows of one's own.

The extending suite inherits the base's scenarios, defenses and attacks (with the scenarios each is confined to),
and adds its own tables. A defense or attack it adds joins every base scenario, also those whose `defenses` or
`attacks` list narrows what runs there (by its settings' full labels, so a base row of the same name that a list
leaves out stays out), unless its own `scenarios` list confines it; a scenario it adds runs what
its own table says. Its name, description and notes are its own; the base's figures, paper rows and tracks come
with it (a track of its own may hold the scenarios it adds).
Cell ids do not name the suite, so the base's stored cells are the extending suite's own: with the base's
committed records at hand (`--reuse`, added by the CLI where the checkout holds them), only the added cells run.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable

from bench.federation.scenario import SpecError
from bench.protocol.records import setting_label
from bench.run.limits import read_toml



def inherit(data: dict[str, Any], where: str,
            read_base: Callable[[str], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`data` with its base's tables laid under its own (the input is not changed), and the base's data;
    `read_base(name)` reads the base suite's TOML data, a SpecError in one line when there is none."""
    base_name = data["extends"]
    if not isinstance(base_name, str) or not base_name.strip():
        raise SpecError(f"{where}: 'extends' must name a suite, e.g. extends = \"core\"; got {base_name!r}")
    base = read_base(base_name)
    if "extends" in base:
        raise SpecError(f"{where}: extends '{base_name}', which itself extends '{base['extends']}'; extend "
                        f"'{base['extends']}' directly and add both suites' rows")
    if base.get("name") == data.get("name"):
        raise SpecError(f"{where}: an extending suite needs a name of its own, not the base's '{base_name}'; e.g. "
                        f"name = \"{base_name}-plus-mine\"")
    base_scenarios = [t for t in base.get("scenarios", []) if isinstance(t, dict)]
    names = {t.get("name") for t in base_scenarios}
    for table in data.get("scenarios", []):
        if isinstance(table, dict) and table.get("name") in names:
            raise SpecError(f"{where}: scenario '{table['name']}' is already the base suite '{base_name}''s; a "
                            "scenario of its own needs a new name (the base's stays as it is)")
    scenarios = [dict(t) for t in base_scenarios] + list(data.get("scenarios", []))
    for kind in ("defenses", "attacks"):
        for table in data.get(kind, []):
            if not isinstance(table, dict) or not isinstance(table.get("name"), str):
                continue   # parse_suite names the fault
            confined = table.get("scenarios")
            for scenario in scenarios[:len(base_scenarios)]:
                listed = scenario.get(kind)
                joins = confined is None or (isinstance(confined, list) and scenario.get("name") in confined)
                if isinstance(listed, list) and joins:
                    scenario[kind] = [*listed, *(label for label in _labels(table) if label not in listed)]
    out = {k: v for k, v in data.items() if k != "extends"}
    out["scenarios"] = scenarios
    for key in ("defenses", "attacks", "figures", "paper", "tracks"):
        out[key] = list(base.get(key, [])) + list(data.get(key, []))
    if not out.get("description"):
        out["description"] = f"{base.get('description', base_name)} (extended: {data.get('name')})"
    return out, base


def _labels(table: dict[str, Any]) -> list[str]:
    """The full labels of a table's settings (its sweep expanded as the suite parser does): a narrowed scenario
    takes the added settings by label, so a base row of the same name it leaves out stays out."""
    params, sweep = table.get("params", {}), table.get("sweep", {})
    if not isinstance(params, dict) or not isinstance(sweep, dict) or \
            not all(isinstance(v, list) and v for v in sweep.values()):
        return [table["name"]]   # parse_suite names the fault
    keys = sorted(sweep)
    return [setting_label(table["name"], {**params, **dict(zip(keys, combo))})
            for combo in itertools.product(*(sweep[k] for k in keys))]


def base_data(ref: str, source: str, where: str) -> dict[str, Any]:
    """The TOML data of the suite `extends` names: a built-in suite, or a file beside the extending one."""
    from bench.registry import SUITES

    beside = Path(source).parent / ref if source.endswith(".toml") else None
    if beside is not None and beside.is_file():
        return read_toml(beside)
    if ref in SUITES:
        return read_toml(Path(SUITES.get(ref)))
    raise SpecError(f"{where}: extends '{ref}', which is neither a built-in suite ({', '.join(SUITES.names())}) nor "
                    "a .toml file beside this one")
