"""Load-time checks of a suite, before anything runs or is written: every scenario's data files and model
checkpoint present and intact and its attack setting within a client's share (check_suite_data), and every
scenario's data loading, model building and attack applicability (preflight). A fault is one line.

Both check what is available (packages, data files, weights), so with `only` (--only) they check just the
scenarios holding a selected cell: a run of some cells does not need what the others would (the others are still
judged for n/a where their files are here). What needs nothing
installed (the suite's structure, names, parameters, bounds) was checked for every cell when it was parsed."""
from __future__ import annotations

import math

from bench.data.checks import DataInfo, check_dataset
from bench.data.loading import resolve_data_root
from bench.models.checkpoints import check_weights
from bench.protocol.contracts import returned_reason
from bench.registry import ATTACKS, DEFENSES, MODELS
from bench.run.cells import one_line
from bench.run.spec import Suite


def preflight(suite: Suite, data_root: str | None, only: str | None = None, weights: bool = True) -> Suite:
    """Load-time checks of every scenario (with `only`: of those holding a selected cell), before any cell runs:
    its data loads, its model builds on it
    (parameter ranges, no sentence longer than the model's positions), its membership pool fits the
    held-out data, and each of its attacks can run there at all (Attack.applicable). A fault raises a
    one-line DataError / SpecError; what is left to run time is what a defense decides. Returns the suite
    without the grid points a defense cannot apply to (Defense.applicable), which it lists with their reasons
    (the page shows them "n/a"), with each classification scenario's chance accuracy.

    The scenarios `only` leaves out are still judged for n/a and chance, from their models' structure, wherever
    their files are at hand, so a narrowed run's page states today's rule for every scenario; those whose files
    are not (a run of some cells does not need what the others would) are named `unchecked`, and the page keeps
    what the store said of them.

    `weights` False (a dry run): models are built for their structure only (bench/models/build.py): a factory
    that reads pretrained weights may leave them unread, since these checks read shapes and layers, never
    values (SmolLM2's weights take about 25 s to dequantize, its config alone a third of that)."""
    import dataclasses

    from bench.federation.candidates import check as check_membership
    from bench.federation.scenario import SpecError

    root = resolve_data_root(data_root)
    models: dict[tuple, object] = {}   # one build per (data, model, parameters): a suite repeats them
    not_applicable: dict[tuple[str, str], str] = {}
    chance: dict[str, float] = {}
    by_scenario = _by_scenario(suite)
    checked = _selected_scenarios(suite, only)
    names = {sc.name for sc in checked}
    judged = [sc for sc in suite.scenarios if sc.name not in names and _at_hand(sc, root)]
    for sc in checked + judged:
        cells = by_scenario[sc.name]
        attacks = list({c.attack.label: c.attack for c in cells}.values())
        full = sc.name in names
        try:
            data, facts = _facts(sc, root, models, weights and full)
            if full and any(ATTACKS.get(a.name).needs_membership for a in attacks):
                check_membership(sc, len(data.test_y))
        except (TypeError, ValueError, OSError) as err:   # OSError: a checkpoint file the checks let through
            raise SpecError(f"scenario '{sc.name}': {one_line(err).split(': ', 1)[-1]}") from None
        if facts.knowledge.task == "classification":
            chance[sc.name] = 1.0 / facts.knowledge.num_classes
        for component in {c.defense.label: c.defense for c in cells}.values():
            defense = DEFENSES.get(component.name)(**component.params)
            reason = returned_reason(defense, "applicable", defense.applicable(facts))
            if reason is not None:
                not_applicable[(sc.name, component.label)] = reason
        for component in attacks if full else ():
            attack = ATTACKS.get(component.name)(**component.params)
            reason = returned_reason(attack, "applicable", attack.applicable(facts))
            if reason is not None:
                raise SpecError(f"scenario '{sc.name}': attack '{component.label}' cannot run in it: {reason}; "
                                f"narrow the scenario's attacks (attacks = [...]) or change the scenario")
    cells = tuple(c for c in suite.cells if (c.scenario.name, c.defense.label) not in not_applicable)
    if not cells:
        scenario, label = next(iter(not_applicable))
        raise SpecError(f"suite '{suite.name}': no defense applies to any scenario ({label} in '{scenario}': "
                        f"{not_applicable[(scenario, label)]}); change the scenarios or the defenses")
    names |= {sc.name for sc in judged}
    return dataclasses.replace(suite, cells=cells, chance=tuple(chance.items()), not_applicable=tuple(
        (scenario, label, reason) for (scenario, label), reason in not_applicable.items()),
        unchecked=tuple(sc.name for sc in suite.scenarios if sc.name not in names))


def _facts(sc, root, models: dict[tuple, object], weights: bool):
    """A scenario's data and the setting its defenses and attacks judge applicability by (built once per
    data and model: a suite repeats them)."""
    import contextlib
    import json

    from bench.data.loading import load_dataset
    from bench.federation.measure import setting
    from bench.models import build_model, structure_only

    data = load_dataset(sc.dataset, root, max_train=sc.max_train, max_test=sc.max_test, seed=sc.seed,
                        seq_len=sc.seq_len)
    key = (sc.dataset, sc.max_train, sc.max_test, sc.seed, sc.seq_len, sc.model,
           json.dumps(sc.model_params, sort_keys=True, default=str), weights)
    if key not in models:
        with contextlib.nullcontext() if weights else structure_only():
            models[key] = build_model(sc.model, data, **sc.model_params)
    return data, setting(sc, data, models[key])


def _at_hand(sc, root) -> bool:
    """Whether a scenario's data files and checkpoint are here, so that judging it downloads and fails nothing
    (with no data root the loader would download)."""
    if root is None and sc.dataset != "digits":
        return False
    try:
        check_weights(sc.model, MODELS.get(sc.model), sc.model_params.get("weights", ""))
        check_dataset(sc.dataset, root)
    except ValueError:   # DataError among them: a missing or damaged file
        return False
    return True


def _by_scenario(suite: Suite) -> dict[str, list]:
    """The suite's cells by scenario name, in one pass (a suite may hold thousands)."""
    out: dict[str, list] = {}
    for cell in suite.cells:
        out.setdefault(cell.scenario.name, []).append(cell)
    return out


def _selected_scenarios(suite: Suite, only: str | None) -> list:
    """The scenarios holding a cell `only` selects (all without it); one that selects none is refused."""
    if not only:
        return suite.scenarios
    from bench.run.runner import select

    names = {c.scenario.name for c in select(suite, only)}
    return [sc for sc in suite.scenarios if sc.name in names]


def check_suite_data(suite, data_root, only: str | None = None) -> None:
    """Every scenario's (with `only`: every selected cell's scenario's) data and model checkpoint present and
    intact, and its attack setting within a client's share."""
    from bench.federation.scenario import SpecError

    root = resolve_data_root(data_root)
    infos: dict[str, DataInfo] = {}
    for sc in _selected_scenarios(suite, only):
        where = f"scenario '{sc.name}'"
        try:
            check_weights(sc.model, MODELS.get(sc.model), sc.model_params.get("weights", ""))
        except ValueError as err:
            model = "" if f"model '{sc.model}'" in str(err) else f" model '{sc.model}'"
            raise SpecError(f"{where}{model}: {err}") from None
        info = infos.setdefault(sc.dataset, check_dataset(sc.dataset, root))
        if info.num_classes is not None and sc.partition == "k-classes" and sc.classes_per_client > info.num_classes:
            raise SpecError(f"{where}: classes_per_client {sc.classes_per_client} exceeds the {info.num_classes} "
                            f"classes of {sc.dataset}; did you mean {info.num_classes}?")
        if info.train_size is None:
            continue
        pool = min(info.train_size, sc.max_train or info.train_size)
        private = int(pool * (1.0 - sc.public_fraction))
        if private < sc.num_clients:
            raise SpecError(f"{where}: {private} private training examples cannot be split over {sc.num_clients} "
                            f"clients; did you mean max_train = {math.ceil(sc.num_clients / (1.0 - sc.public_fraction))}?")
        share = private // sc.num_clients
        if sc.attack_batch_size > share:
            raise SpecError(f"{where}: attack_batch_size {sc.attack_batch_size} exceeds a client's share of the "
                            f"data ({share} examples on average); did you mean {share}?")
