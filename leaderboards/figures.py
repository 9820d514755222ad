"""Suite-declared figures: curves of one column against another, drawn with seaborn.

A suite TOML may list figures:

    [[figures]]
    title = "kde_mi vs ratio"
    x = "ratio"            # a metric, a defense or attack parameter, or defense/attack/scenario
    y = "kde_mi"
    hue = "rule"           # optional
    attack = "ilrg"        # optional filter on the attack name
    scenario = "..."       # optional filter on the scenario name
    where = { rho = 0.5 }  # optional filter on metrics or parameters
    logx = true            # optional
    series = "pruned_fraction_by_round"   # optional: plot a per-round dict from the record's details;
                                          # x and y then only title the axes

Figures are drawn from stored records only, into PNGs without metadata (deterministic). A figure
with fewer than two points is not drawn; axes carry plain numbers (no offset such as "+1e2") and
bytes in kB/MB.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

FIGURE_KEYS = {"title", "x", "y", "hue", "attack", "scenario", "defense", "where", "logx", "logy", "series"}


def check_figure(spec: Any, known: dict[str, set[str]] | None = None) -> None:
    """The figure's keys and their types; with `known` (the suite's names: leaderboards' check_names), its axes
    and filters too, since an axis no record holds draws nothing, silently. With `series`, x and y only title
    the axes."""
    check_table(spec, "a figure", 'x = "ratio", y = "kde_mi"')
    unknown = set(spec) - FIGURE_KEYS
    if unknown or "x" not in spec or "y" not in spec:
        raise ValueError(f"figure needs x and y and accepts {sorted(FIGURE_KEYS)}; got {sorted(spec)}")
    check_types(spec, ("title", "x", "y", "hue", "series", *IDENTITY), ("logx", "logy"))
    if known is not None:
        axes = ("hue",) if spec.get("series") else ("x", "y", "hue")
        check_names(spec, known, {k: "column" for k in axes})


IDENTITY = ("scenario", "defense", "attack")


def check_table(spec: Any, what: str, example: str) -> None:
    """A figure or paper row is a table of keys (a page's pages.json is anyone's file: [NaN] is no figure)."""
    if not isinstance(spec, dict) or not all(isinstance(k, str) for k in spec):
        raise ValueError(f"{what} must be a table like {{{example}}}, got {type(spec).__name__} {str(spec)[:40]}")


def check_types(spec: dict[str, Any], texts: tuple[str, ...], flags: tuple[str, ...] = ()) -> None:
    """Text keys hold text, flags true or false, `where` a table."""
    for key in texts:
        if key in spec and not isinstance(spec[key], str):
            raise ValueError(f"{key} must be text, got {type(spec[key]).__name__} {str(spec[key])[:40]}")
    for key in flags:
        if key in spec and not isinstance(spec[key], bool):
            raise ValueError(f"{key} must be true or false, got {type(spec[key]).__name__}")
    if "where" in spec and not isinstance(spec["where"], dict):
        raise ValueError(f"where must be a table of column = value, got {type(spec['where']).__name__}")


def check_names(spec: dict[str, Any], known: dict[str, set[str]], keys: dict[str, str]) -> None:
    """Each of `keys` (spec key -> the kind of name it holds), the identity filters and the `where` keys of a
    figure or paper row name something of the suite: `known` maps scenario, defense, attack, metric and column
    (a metric, a parameter the suite sets, or scenario/defense/attack) to the valid names."""
    wanted = {**{k: k for k in IDENTITY}, **keys}
    for key, kind in wanted.items():
        if spec.get(key) not in (None, "") and spec[key] not in known[kind]:
            raise ValueError(_unknown(f"{key} = {spec[key]!r}", spec[key], known[kind]))
    where = spec.get("where", {})
    for key in where if isinstance(where, dict) else ():
        if key not in known["column"]:
            raise ValueError(_unknown(f"where key {key!r}", key, known["column"]))


def _unknown(what: str, value: Any, valid: set[str]) -> str:
    names = sorted(valid)
    close = difflib.get_close_matches(str(value), names, n=1)
    hint = f"did you mean '{close[0]}'?" if close else \
        f"this suite has {', '.join(names[:12])}" + (", ..." if len(names) > 12 else "")
    return f"{what} names nothing this suite records, so nothing would be drawn or compared; {hint}"


def lookup(rec: dict[str, Any], key: str) -> Any:
    for source in (rec["metrics"], rec["defense_params"], rec["attack_params"]):
        if key in source:
            return source[key]
    return rec.get(key)


def draw(spec: dict[str, Any], records: list[dict[str, Any]], path: Path) -> bool:
    rows = []
    for rec in records:
        # run-level metrics (costs, KDE MI) are measured on blocked cells too; a missing y drops the row below
        if rec["status"] == "failed" or any(spec.get(k) and rec[k] != spec[k] for k in ("attack", "scenario", "defense")):
            continue
        if any(lookup(rec, k) != v for k, v in spec.get("where", {}).items()):
            continue
        hue = str(lookup(rec, spec["hue"])) if spec.get("hue") else ""
        if spec.get("series"):
            for step, value in sorted(rec["details"].get(spec["series"], {}).items(), key=lambda kv: int(kv[0])):
                rows.append({spec["x"]: int(step), spec["y"]: value, "hue": hue})
            continue
        x, y = lookup(rec, spec["x"]), lookup(rec, spec["y"])
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            rows.append({spec["x"]: x, spec["y"]: y, "hue": hue})
    if len(rows) < 2:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    frame = pd.DataFrame(rows).sort_values([spec["x"], "hue"])
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    sns.lineplot(data=frame, x=spec["x"], y=spec["y"], hue="hue" if spec.get("hue") else None, marker="o",
                 errorbar=None, ax=ax)
    from matplotlib.ticker import FuncFormatter

    from leaderboards.formats import tick_bytes
    from leaderboards.schema import schema_of
    schema = schema_of(records)
    for which, key in (("x", spec["x"]), ("y", spec["y"])):
        if spec.get(f"log{which}") and (frame[key] > 0).all():   # a log axis is log, or not claimed
            (ax.set_xscale if which == "x" else ax.set_yscale)("log")
        else:
            try:
                ax.ticklabel_format(axis=which, useOffset=False, style="plain")
            except AttributeError:   # a categorical axis has no offset to turn off
                pass
        if key in schema and schema[key].unit == "B":
            (ax.xaxis if which == "x" else ax.yaxis).set_major_formatter(FuncFormatter(lambda v, _: tick_bytes(v)))
    ax.set_title(spec.get("title", f"{spec['y']} vs {spec['x']}"), fontsize=10)
    if spec.get("hue"):
        ax.legend(title=spec["hue"], fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return True
