"""`leakbench verify DIR` and `leakbench site --verify N` on the command line: the cells a folder's pages decide with
(bench/evaluation/deciding.py, from the page info the site reads), the plan stated before anything runs, each
outcome as it is known, each scenario's ranks kept, and the report written for `site --report FILE`. The
recomputation and its tolerances are bench/run/verify.py's; what a page shows (its page info, a scenario table's
ranks) comes in from bench/cli.py as `Pages`, so nothing here imports the renderer.
"""
from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

Say = Callable[[str], None]   # bench/cli.py's say: a line on stdout
Info = Callable[[str], "dict[str, Any] | None"]   # a built-in suite's current page info (bench/cli.py)


@dataclass(frozen=True)
class Pages:
    """What the renderer says of a folder's pages: a suite's page info (leaderboards/site.py page_info) and a
    scenario's row ranks (leaderboards/tables.py ranks)."""

    page_info: Callable[[str, Path, Info], "dict[str, Any] | None"]
    ranks: Callable[[list, "dict[str, Any] | None"], Any]


def outcome_line(o) -> str:
    """One line of `leakbench verify`'s report."""
    if o.state == "reproduced":
        return f"reproduced  {o.label} ({o.seconds:.1f} s)"
    return f"{o.state:11s} {o.label}: {o.why}"


def verified(directory: Path, records: list, current: Info, pages: Pages, say: Say, data_root: str | None,
             sample: int | None, progress, only: str | None = None, seed: int = 0, tolerance=None, force: bool = False,
             dry_run: bool = False, workers: int = 1, threads: int | None = None, done: frozenset = frozenset()):
    """`leakbench verify` of one folder: the cells its pages' structure says decide something, plus `sample`, less
    those `done` (a resumed report's), with the plan stated before anything runs and each row's ranks kept; None
    for a dry run."""
    from bench.evaluation.deciding import deciding_cells
    from bench.run.verify import Tolerance, plan, verify

    infos = {s: pages.page_info(s, directory, current) for s in dict.fromkeys(r["suite"] for r in records)}
    chosen = plan(records, deciding_cells(records, infos), sample, only, seed, force, data_root, done)
    say(chosen.summary(str(directory), workers))
    if dry_run:
        for rec, why in chosen.chosen:
            say(f"{'stale' if rec['cell_id'] in chosen.stale else 'recompute':10s} {_label(rec)}: {why}")
        return None
    return verify(chosen, data_root, tolerance or Tolerance(), lambda recs: pages.ranks(recs, infos[recs[0]["suite"]]),
                  progress, workers, threads)


def _label(rec) -> str:
    from bench.evaluation.schema import attack_label, defense_label
    return f"{rec['scenario']}/{defense_label(rec)}/{attack_label(rec)}"


def resumed(report_to: Path | None, directory: Path, records: list, say: Say) -> tuple[dict, ...]:
    """The outcomes an existing --report FILE already holds for this folder's records as they are (a piece of an
    earlier run, on any machine), to keep and not recompute: only reproduced ones are kept; stale ones are planned
    again (the code may have caught up), and so are those that differed (a rerun after a fix must check again,
    not repeat the old outcome); those of records since recomputed are left out. Nothing for a new file."""
    from bench.evaluation.verification import current_outcomes, read_json

    if report_to is None or not report_to.is_file():
        return ()
    checked, dropped = current_outcomes(read_json(report_to), str(report_to), records)
    if checked.folder != directory.name:
        raise ValueError(f"--report '{report_to}' is a report of folder {checked.folder!r}, not {directory.name!r}; "
                         "pass another path")
    kept = tuple(o for o in checked.outcomes if o["state"] == "reproduced")
    differed = sum(o["state"] == "differs" for o in checked.outcomes)
    say(f"verify: resuming {report_to}: {len(kept)} cell(s) already reproduced are kept"
        + (f", {differed} that differed are checked again" if differed else "")
        + (f", {dropped} of records since recomputed left out" if dropped else ""))
    return kept


def verify_command(args, current: Info, pages: Pages, say: Say) -> int:
    """`leakbench verify DIR`: exit 1 when a cell differs, 0 otherwise (stale cells are said, not counted); with
    --report FILE the report is rewritten after every cell and a rerun resumes it, so a folder too large for one
    sitting is verified in pieces."""
    import datetime
    import json

    from bench.models import torch_device
    from bench.run.recompute import machine
    from bench.run.verify import Tolerance
    from bench.evaluation.exports import load_records
    from bench.evaluation.verification import Checked

    torch_device.use(args.device)
    tolerance = Tolerance.parse(args.tolerance)
    if args.sample == "all":
        sample = None
    elif args.sample is None or args.sample.isdigit():
        sample = int(args.sample or 0)
    else:
        raise ValueError(f"--sample {args.sample!r}: expected a number of cells >= 0 or 'all'")
    for name in ("workers", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} {value}: expected a number >= 1")
    report_to = Path(args.report) if args.report is not None else None
    if report_to is not None and (report_to.is_dir() or not report_to.parent.resolve().is_dir()
                                  or not os.access(report_to.parent.resolve(), os.W_OK)):
        raise ValueError(f"--report '{args.report}': not a file in a writable directory; pass a path such as "
                         "verification.json")
    records = load_records(args.dir)
    directory = (Path(args.dir) if Path(args.dir).is_dir() else Path(args.dir).parent).resolve()
    earlier = resumed(report_to, directory, records, say)   # a dry run plans what is left
    here, today, fresh = machine(), datetime.date.today().isoformat(), []

    def write(outcomes: tuple) -> None:
        if report_to is not None:
            part = report_to.with_name(report_to.name + ".part")
            part.write_text(json.dumps(Checked(directory.name, here, today, len(records), outcomes).to_json(),
                                       indent=1, default=str) + "\n")
            os.replace(part, report_to)   # a killed run leaves the last whole report, never half of one

    def progress(outcome) -> None:
        say(outcome_line(outcome))
        fresh.append(outcome.to_json(here, today))
        write(earlier + tuple(fresh))

    report = verified(directory, records, current, pages, say, args.data_root, sample, progress, args.only,
                      args.seed, tolerance, args.force, args.dry_run, args.workers, args.threads,
                      frozenset(o["cell_id"] for o in earlier))
    if report is None:
        return 0
    p = report.plan
    say(f"verify {args.dir}: {len(report.outcomes)} of {len(p.records)} cell(s) checked ({p.deciding} deciding "
        f"what its pages show, {p.sampled} drawn with seed {args.seed}): {report.count('reproduced')} reproduced, "
        f"{report.count('differs')} differ, {report.count('stale')} stale; {report.seconds:.1f} s on "
        f"{report.machine}")
    whole = report.checked(directory.name, earlier)
    if report_to is not None:
        write(whole.outcomes)
        say(f"verify {args.dir}: report written to {args.report}" + (
            f" ({len(whole.outcomes)} cells with the {len(earlier)} resumed: {whole.count('reproduced')} reproduced, "
            f"{whole.count('differs')} differ, {whole.count('stale')} stale)" if earlier else ""))
    return 1 if whole.count("differs") else 0
