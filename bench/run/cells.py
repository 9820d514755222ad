"""A group's cells: one federated run for a (scenario, defense), then every attack cell scored on it.

Each cell becomes a record (status ok, blocked, diverged or failed, with its one-line reason),
holding what a page needs without today's registry: the attack's family and threat model, a snapshot of the
schema of every metric it reports (display name, unit, direction, format), whether its defense row is
undefended (`Defense.undefended`: the row an attack must break before it judges the others,
bench/evaluation/calibration.py), and the defense's and attack's one-line descriptions with their paper and code
links. Each record is sealed with a digest of
its content (bench/protocol/records.py), so a later edit is caught where it is read back. A failing
cell never stops the others; the exit status reports it.
"""
from __future__ import annotations

import os
import platform
import time
import traceback
from dataclasses import replace
from typing import Any, Callable, Iterator

import numpy as np
import torch

from bench.protocol.attack import Reconstruction
from bench.protocol import contracts
from bench.protocol.records import UNDEFENDED, seal
from bench.registry import ATTACKS, DEFENSES, METRICS, discover, unlogged, using
from bench.run.deadline import CellTimeout, exit_reason, within
from bench.run.leases import new_run_id
from bench.run.spec import Cell


def environment(cell: Cell) -> dict[str, Any]:
    """Where and with what the cell was computed: the hash of each component it used (bench/run/version.py: its code
    with what the registries handed out while it computed, the installed plugins that took part, the libraries and
    the data files it read) and the fingerprint over them; `plugins`, the plugins among them; the CPU, torch's build,
    the full library versions and the numerical settings in effect (bench/run/numerics.py). `threads` (torch's
    intra-op threads) is kept since it sets the order of float reductions: `leakbench verify` recomputes with the
    same count."""
    from bench.protocol.records import fingerprint_of
    from bench.registry import in_use
    from bench.run import numerics
    from bench.run.version import cell_components, package_version
    components = cell_components(cell, used=in_use())
    plugins = {k.removeprefix("plugin "): v for k, v in components.items() if k.startswith("plugin ")}
    env = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
           "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "leakbench": package_version(),
           "fingerprint": fingerprint_of(components), "components": components, "device": compute_device(),
           "cpu": numerics.cpu(), "torch_build": numerics.torch_build(), "libraries": numerics.libraries(),
           "numerics": numerics.settings()}
    return env | ({"plugins": plugins} if plugins else {})


def compute_device() -> str:
    """The torch device the cell ran on (or auto's rule), with the GPU's name (not part of the cell id: bench/models/torch_device.py)."""
    from bench.models.torch_device import AUTO_GPU_PARAMS, setting
    name = setting()
    if name == "cpu":
        return "cpu"
    gpu = f"cuda ({torch.cuda.get_device_name(0)})"
    return gpu if name == "cuda" else f"auto: {gpu} for models of {AUTO_GPU_PARAMS:,} parameters or more, cpu below"


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _record(cell: Cell, status: str, reason: str, metrics: dict, details: dict | None = None) -> dict[str, Any]:
    from bench.protocol.defense import KEY_TOPOLOGIES
    details = dict(details or {})
    details.setdefault("key_topology", DEFENSES.get(cell.defense.name).key_topology)
    details["decrypts_single_upload"] = KEY_TOPOLOGIES[details["key_topology"]]
    details["family"] = ATTACKS.get(cell.attack.name).family
    details["threat_model"] = ATTACKS.get(cell.attack.name).threat_model
    details["sources"] = {"defense": sources(DEFENSES, cell.defense.name), "attack": sources(ATTACKS, cell.attack.name)}
    details["metric_schema"] = {m.name: m.obj.snapshot() for m in METRICS.entries() if m.name in metrics}
    return seal({"cell_id": cell.cell_id, "suite": cell.suite, "scenario": cell.scenario.name,
                 "defense": cell.defense.name, "defense_params": cell.defense.params, "attack": cell.attack.name,
                 "attack_params": cell.attack.params, "status": status, "reason": reason, "metrics": metrics,
                 "details": details, "config": cell.config(), "environment": environment(cell)})


def sources(registry, name: str) -> dict[str, str]:
    """What a page says of a defense or attack: its one-line description and its paper and code links."""
    entry = registry.entry(name)
    links = getattr(entry.obj, "links", {}) or {}
    return {"about": entry.description, **{k: str(v) for k, v in sorted(links.items()) if v}}


def attacked_uploads(cell: Cell, attack, run):
    """What the cell's attack reads: the honest uploads, or those of the model a malicious-model attack sent."""
    if attack.threat_model == "passive":
        return run.targets
    targets = run.modified.get(cell.attack.label)
    if isinstance(targets, Exception):
        raise targets
    if targets is None:
        raise RuntimeError(f"the run has no upload under the model '{cell.attack.label}' sends; federate its "
                           f"group with it (bench.run.cells.federate)")
    return targets


def score_cell(cell: Cell, run) -> dict[str, Any]:
    """Run the cell's attack on every attacked upload of the run and compute every applicable metric."""
    attack = ATTACKS.get(cell.attack.name)(**cell.attack.params)
    run_values = dict(run.metrics)
    if run.diverged is not None:   # an outcome of the defense's training, neither a failure nor a block
        return _record(cell, "diverged", run.diverged, _run_metrics(run_values), dict(run.details))
    targets = attacked_uploads(cell, attack, run)
    reason = contracts.returned_reason(attack, "blocked", attack.blocked(targets[0].view, targets[0].knowledge))
    if reason is not None:
        details = dict(run.details) | {"sent_in_clear": sent_in_clear(targets[0].view, set())}
        return _record(cell, "blocked", f"blocked by design: {reason}", _run_metrics(run_values), details)
    from bench.protocol.evidence import Evidence
    per_target: dict[str, list] = {}
    evidence: dict[str, object] = {}   # metrics' extra details (raw scores, intervals), first upload's
    texts, info = [], []
    attack_time, thumb = 0.0, None
    read: set[str] = set()
    # canary trials (a run's uploads are all trials or none): scored together, one label each; read off the
    # first upload so that spilled uploads are not loaded from disk an extra time (no upload: vacuously trials)
    trials = len(targets) == 0 or targets[0].truth.trial
    pooled: list[tuple[Reconstruction, Any]] = []
    recs: list[Reconstruction] = []
    for i, target in enumerate(targets):
        start = time.perf_counter()
        rec = contracts.returned_reconstruction(
            attack, attack.run(target.view, target.knowledge, seed=cell.scenario.seed * 1000 + i))
        attack_time += time.perf_counter() - start
        read |= set(rec.read_meta)
        if i == 0 and rec.images is not None:   # ground truth next to the reconstruction, for the page
            from bench.run.thumbnails import thumbnail
            thumb = thumbnail(rec.images, target.truth.x)
        if i == 0:
            evidence.update(rec.extra.get("details", {}))
        recs.append(rec)
        if trials and rec.scores is not None:
            pooled.append((rec, target))
        else:   # scored now, so that a run's spilled targets are not all held at once
            _score(Evidence(rec, target.truth, target.view, target.knowledge, run_values), per_target,
                   evidence if i == 0 else None)
    if pooled:
        _score(_pooled(pooled, run_values), per_target, evidence)
    for rec in recs:   # per upload, the attack's scalar facts; recovered sentences beside the references matched
        info.append({k: v for k, v in rec.extra.items() if isinstance(v, (bool, int, float, str))})
        if rec.texts is not None:
            matched, reference = rec.extra.get("_matched", (None, None))
            texts.append({"recovered": list(rec.texts), "matched": matched, "reference": reference})
    run_values["attack_s"] = attack_time / len(targets)
    metrics = _run_metrics(run_values)
    for name, values in per_target.items():
        unavailable = [v for v in values if isinstance(v, str)]
        metrics[name] = unavailable[0] if unavailable else float(np.mean(values))
    details = dict(run.details)
    details["per_target"] = {k: v for k, v in per_target.items()}
    details.update(evidence)
    for name, values in per_target.items():   # a metric's own interval (evidence) wins over the batches' spread
        if len(values) > 1 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values):
            details.setdefault(f"{name}_ci95", bootstrap_ci(values))
    if any(info):
        details["attack_info"] = info
    if texts:
        details["texts"] = texts
    details["sent_in_clear"] = sent_in_clear(targets[0].view, read)
    if thumb:
        details["thumbnail"] = thumb
    return _record(cell, "ok", "", metrics, details)


def _score(ev, per_target: dict[str, list], evidence: dict | None) -> None:
    """Every per-target metric on one piece of evidence; `evidence` collects their details (first upload's)."""
    for m in METRICS.entries():
        if m.obj.per_target:
            value = contracts.metric_value(m.obj, m.obj.compute(ev))
            if value is not None:
                per_target.setdefault(m.name, []).append(value)
                if evidence is not None and m.obj.details is not None:
                    evidence.update(m.obj.details(ev))


def _pooled(scored: list, run_values: dict[str, Any]):
    """All trials of a cell as one piece of evidence: their scores and labels in trial order, the rest the
    first trial's (the same view layout and knowledge)."""
    from bench.protocol.evidence import Evidence

    rec, target = scored[0]
    scores = np.concatenate([np.asarray(r.scores, dtype=np.float64).reshape(-1) for r, _ in scored])
    member = np.concatenate([t.truth.member for _, t in scored])
    return Evidence(replace(rec, scores=scores), replace(target.truth, member=member), target.view, target.knowledge,
                    run_values)


def bootstrap_ci(values: list[float], resamples: int = 2000, seed: int = 0) -> list[float]:
    """95 % percentile bootstrap interval of the mean over attacked uploads (resampled with replacement,
    seeded: a record's interval is reproducible)."""
    data = np.asarray(values, dtype=float)
    means = data[np.random.default_rng(seed).integers(0, len(data), (resamples, len(data)))].mean(1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def sent_in_clear(view, read: set[str]) -> list[dict[str, Any]]:
    """The view's metadata as the record lists it: key, size, public layout, and whether this
    cell's attack read it; a page shows the entries no attack read as "sent in the clear, not attacked"."""
    return [{"key": k, "bytes": len(v), "layout": view.layouts.get(k, "opaque"), "attacked": k in read}
            for k, v in sorted(view.meta.items())]


def _run_metrics(run_values: dict[str, Any]) -> dict[str, Any]:
    from bench.protocol.evidence import Evidence
    out = {}
    for m in METRICS.entries():
        if not m.obj.per_target:
            value = contracts.metric_value(m.obj, m.obj.compute(Evidence(run=run_values)))
            if value is not None:
                out[m.name] = value
    return out


def federate(cell: Cell, data_root: str | None, on_round: Callable[[str], None] | None = None,
             group: list[Cell] | None = None):
    """The federated run shared by every cell of the cell's group (`group`, default the cell alone: what its
    attacks need drawn, e.g. membership candidates); on_round hears "round r/R" as they finish."""
    from bench.data.loading import load_dataset, resolve_data_root
    from bench.federation.budget import apply_budget
    from bench.federation.engine import run_federation

    sc = cell.scenario
    data = load_dataset(sc.dataset, resolve_data_root(data_root), max_train=sc.max_train, max_test=sc.max_test,
                        seed=sc.seed, seq_len=sc.seq_len)
    defense = DEFENSES.get(cell.defense.name)(**cell.defense.params)
    undefended = bool(defense.undefended())   # of the row as configured, before the run changes its state
    apply_budget(defense, sc, data_root)
    with unlogged():   # the group's attacks: what the run draws for them is theirs (each scores its own cell)
        wanted = any(getattr(ATTACKS.get(c.attack.name), "needs_membership", False) for c in (group or [cell]))
        modifiers = {c.attack.label: ATTACKS.get(c.attack.name)(**c.attack.params) for c in (group or [cell])
                     if ATTACKS.get(c.attack.name).threat_model != "passive"}
    run = run_federation(sc, data, defense, progress=on_round, needs_membership=wanted, modifiers=modifiers)
    run.details[UNDEFENDED] = undefended
    return run


def failed(cell: Cell, err: BaseException, run=None) -> dict[str, Any]:
    """Record of a cell that raised: the one-line reason, and the run's metrics when the run itself finished."""
    if os.environ.get("LEAKBENCH_TRACEBACK"):
        traceback.print_exception(err)
    reason = exit_reason(err) if isinstance(err, SystemExit) else one_line(err)
    if run is None:
        return _record(cell, "failed", reason, {})
    return _record(cell, "failed", reason, _run_metrics(dict(run.metrics)), {UNDEFENDED: run.details.get(UNDEFENDED)})


def run_group(cells: list[Cell], data_root: str | None, run_id: str | None = None,
              on_round: Callable[[str], None] | None = None,
              scored: list[Cell] | None = None) -> Iterator[dict[str, Any]]:
    """Federate once for the group's scenario and defense, then score each attack cell (or only `scored`, cells
    of the group: the run is still the whole group's, whose attacks decide what it draws, e.g. membership
    candidates or a malicious server's exchange; `leakbench verify` recomputes a sample so).

    Every record carries the federated run's id in its environment (stored, kept out of the rendered
    results so they stay deterministic), so a group's rows can be seen to share one run."""
    run_id = run_id or new_run_id()
    for record in _group_records(cells, data_root, on_round, cells if scored is None else scored):
        record["environment"] = {**record["environment"], "run_id": run_id}
        yield record


# what a cell's code may raise that becomes its failed record: any error, its time limit, and a sys.exit, which
# would otherwise end the run with status 0 and the cell missing (KeyboardInterrupt still stops the run)
CELL_FAULTS = (Exception, CellTimeout, SystemExit)


def _group_records(cells: list[Cell], data_root: str | None, on_round: Callable[[str], None] | None,
                   scored: list[Cell]) -> Iterator[dict[str, Any]]:
    limit = cells[0].timeout_s   # one scenario, one limit: each step (the run, each attack) gets it whole
    if limit:
        discover()   # outside the limit: loading every component is the process's cost, not the cell's
    # what the registries hand out and the files read are logged (bench/registry.py): the run's for every cell of
    # the group, each attack's for its own cell; each record's components are those (bench/run/version.py)
    with using() as shared:
        try:
            with within(limit, "the federated run"):
                run = federate(cells[0], data_root, on_round, group=cells)
        except CELL_FAULTS as err:  # recorded per cell and reported by the exit status, never hidden
            run = err
    if isinstance(run, CELL_FAULTS):
        for cell in scored:
            with using(shared):
                record = failed(cell, run)
            yield record
        return
    for cell in scored:
        with using(shared):
            try:
                with within(limit, f"the attack {cell.attack.label}"):
                    record = score_cell(cell, run)
            except CELL_FAULTS as err:
                record = failed(cell, err, run)
        yield record
