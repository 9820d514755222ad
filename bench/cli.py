"""Command line: `leakbench list KIND`, `leakbench run SUITE`, `leakbench leaderboard`, `leakbench site ROOT`,
`leakbench compare OUT_A OUT_B`, `leakbench verify DIR`.

Bad input (suite, data, store) ends with one line on stderr naming the fault and the fix,
and exit status 2; a run whose cells failed exits 1 after every result is stored. Output read only in part
(`leakbench list metrics | head -1`) ends quietly: a closed stdout is the reader's choice, not a fault.
"""
from __future__ import annotations

import argparse
import os
import sys
from datetime import date as day, datetime, timezone
from pathlib import Path

from bench.catalog import KIND_NAMES
from bench.registry import PluginError, UnknownName
from bench.run.executors import EXECUTORS

DEFAULT_OUT = "out"


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block): the fault, then where the help is; exit 2."""

    def error(self, message: str):
        self.exit(2, f"leakbench: error: {message}; see `{self.prog} --help`\n")


def _parser() -> argparse.ArgumentParser:
    from bench.run.version import package_version

    p = _Parser(prog="leakbench", description="Privacy attacks vs. defenses in federated learning.")
    p.add_argument("--version", action="version", version=f"leakbench {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    ls = sub.add_parser("list", help="list registered things, one line each")
    ls.add_argument("kind", choices=sorted(KIND_NAMES))
    run = sub.add_parser("run", help="run a suite (built-in name or TOML path) and write the leaderboard")
    run.add_argument("suite")
    run.add_argument("--out", default=DEFAULT_OUT, help="output directory (store, results, leaderboard)")
    run.add_argument("--data-root", default=None, help="data root (default: $LEAKBENCH_DATA; digits needs none)")
    run.add_argument("--workers", type=int, default=None,
                     help="groups computed at once, one federated run each (process: pool size; ray: num_cpus of "
                          "a local Ray, or groups in flight on a cluster, default one per CPU)")
    run.add_argument("--executor", choices=EXECUTORS, default=None,
                     help="where groups run: local (this process; the default for one worker), process (a pool "
                          "of --workers processes; the default for more), ray (one task per group; needs "
                          "pip install 'leakbench[ray]')")
    run.add_argument("--ray-address", metavar="HOST:PORT", default=None,
                     help="an existing Ray cluster (HOST:PORT of its head, or auto) instead of a local Ray; "
                          "its nodes must see the data root at the same path (or set LEAKBENCH_DATA there) and "
                          "run this leakbench version")
    run.add_argument("--device", default="cpu", help="auto | cpu | cuda: where training and optimization attacks run")
    run.add_argument("--force", action="store_true", help="recompute the selected cells even if stored")
    run.add_argument("--only", metavar="PATTERN", default=None,
                     help="run only cells whose label scenario/defense/attack matches (glob, or a substring)")
    run.add_argument("--dry-run", action="store_true", help="state the suite's cell count, then list the selected "
                                                            "cells and whether each would run")
    run.add_argument("--max-cells", type=int, default=None, metavar="N",
                     help="refuse a suite of more cells than N (default $LEAKBENCH_MAX_CELLS, else 20000)")
    run.add_argument("--max-scenarios", type=int, default=None, metavar="N",
                     help="refuse a suite of more scenarios than N (default $LEAKBENCH_MAX_SCENARIOS, else 2000)")
    run.add_argument("--cell-timeout", type=float, default=None, metavar="SECONDS",
                     help="time limit of each step of a cell (its group's federated run, its attack) where its "
                          "scenario sets no cell_timeout_s; default: the suite's cell_timeout_s, else none")
    run.add_argument("--reuse", metavar="DIR", action="append", default=[],
                     help="another output directory (store or results.json) whose finished cells computed by this "
                          "code are copied instead of recomputed: suites sharing a scenario compute it once "
                          "(repeatable)")
    lb = sub.add_parser("leaderboard", help="render the leaderboard of every suite in the store in --out")
    lb.add_argument("--out", default=DEFAULT_OUT)
    site = sub.add_parser("site", help="re-render every suite directory under ROOT from its results.json (no "
                                       "rerun) and write ROOT/index.html linking them")
    site.add_argument("root")
    site.add_argument("--date", default=None, metavar="YYYY-MM-DD",
                      help="generation date every page prints (default: today, UTC); pass it to re-render identically")
    site.add_argument("--verify", type=int, default=None, metavar="N",
                      help="first recompute every cell that decides what each directory's pages show, plus N more "
                           "drawn at random (`leakbench verify`); publish only when none differs, and mark each "
                           "reproduced cell and each page's verification report")
    site.add_argument("--report", metavar="FILE", action="append", default=[],
                      help="a report of `leakbench verify DIR --report FILE` (made elsewhere) to show on the pages of "
                           "the directory it names; checked against its records (repeatable)")
    site.add_argument("--data-root", default=None, help="data root for --verify (default: $LEAKBENCH_DATA)")
    site.add_argument("--standard", metavar="SUITE", help="the suite heading the front page (default: core)")
    ver = sub.add_parser("verify", help="recompute the cells that decide what a results directory's pages show "
                                        "(and --sample more) from their stored configs and compare each at its "
                                        "tolerance: reproduced, differs or stale (exit 1 if any differs)")
    ver.add_argument("dir", help="an output directory of `leakbench run` (its results.json), e.g. one you were sent")
    ver.add_argument("--sample", default=None, metavar="N",
                     help="also N cells drawn at random (seeded) from those that decide nothing on the pages; 'all' "
                          "for every cell (default 0)")
    ver.add_argument("--only", metavar="PATTERN", default=None,
                     help="only cells whose label scenario/defense/attack matches (glob, or a substring)")
    ver.add_argument("--tolerance", metavar="REL|METRIC=ABS", action="append", default=[],
                     help="relative tolerance of the real-valued metrics without an entry of their own (default "
                          "1e-3), or one metric's absolute tolerance in its unit (repeatable); verdict bands and "
                          "ranks must hold whatever the tolerance")
    ver.add_argument("--seed", type=int, default=0, help="seed of the random sample (default 0)")
    ver.add_argument("--workers", type=int, default=1, help="rows recomputed at a time, each in its own process "
                                                            "(default 1)")
    ver.add_argument("--threads", type=int, default=None,
                     help="torch threads per row instead of the count each record states (trained models then move "
                          "past the tolerances: bench/run/verify.py)")
    ver.add_argument("--force", action="store_true",
                     help="recompute stale cells too (computed by other code), comparing them all the same")
    ver.add_argument("--dry-run", action="store_true",
                     help="state how many cells and rows would be recomputed and about how long it would take, list "
                          "each with why it was chosen, and recompute nothing")
    ver.add_argument("--report", metavar="FILE", default=None,
                     help="write the outcome of every recomputed cell, its tolerances, this machine and the date to "
                          "FILE (JSON), for `leakbench site --report FILE`")
    ver.add_argument("--data-root", default=None, help="data root (default: $LEAKBENCH_DATA)")
    ver.add_argument("--device", default="cpu", help="auto | cpu | cuda: where the recomputation runs")
    cmp = sub.add_parser("compare", help="per-cell metric deltas between two output directories (B - A)")
    cmp.add_argument("out_a")
    cmp.add_argument("out_b")
    return p


def say(text: str) -> None:
    """Print a line to stdout; once the reader has closed it, the rest goes to /dev/null and the command
    goes on to its own exit status (no BrokenPipeError, now or when Python flushes at exit)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _stdout_closed()


def _stdout_closed() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _list(kind: str) -> int:
    from bench.catalog import lines, load

    for line in load()["refused"]:
        print(f"leakbench: {line}", file=sys.stderr)
    say("\n".join(lines(kind)))
    return 0


def _refusals() -> None:
    """One line per plugin refused at load, on stderr; the run goes on with every other component."""
    from bench.registry import refusals

    for line in refusals():
        print(f"leakbench: {line}", file=sys.stderr)


def _run(args) -> int:
    from tqdm import tqdm

    from bench.run.executors import check_options
    from bench.run.limits import Limits
    from bench.run.preflight import check_suite_data, preflight
    from bench.run.runner import run_suite
    from bench.run.spec import load_suite
    from bench.run.store import Store
    from leaderboards.render import write_outputs

    check_options(args.executor, args.workers, args.ray_address)
    from bench.models import torch_device
    torch_device.use(args.device)                # one line and exit 2 for cuda without a GPU, before anything runs
    limits = Limits.resolve(args.max_cells, args.max_scenarios)
    # every fault a cell could trip on fails from here on, before any write
    suite = load_suite(args.suite, limits, args.cell_timeout)
    if args.dry_run:   # the suite's size first, before the checks and the list
        say(f"suite {suite.name}: {len(suite.cells)} cell(s) in {len(suite.scenarios)} scenario(s) (limit "
            f"{limits.cells:,} cells, {limits.scenarios:,} scenarios); the selected cells follow")
    _refusals()                             # plugins the suite does not name: the run goes on without them
    check_suite_data(suite, args.data_root, args.only)   # what is installed: for the selected cells only
    # without the grid points a defense cannot apply to (shown n/a); a dry run builds models without weights
    suite = preflight(suite, args.data_root, args.only, weights=not args.dry_run)
    check_out(args.out)
    reuse = list(args.reuse or [])
    committed = committed_results(suite.extends) if suite.extends else None
    if committed is not None and not any(Path(r).resolve() == committed.resolve() for r in reuse):
        reuse.append(committed)   # the base's committed cells that this code computed are copied, not rerun
        say(f"suite {suite.name}: extends {suite.extends}; its committed records ({committed}) are reused where "
            "the current code computed them")
    summary = run_suite(suite, args.out, data_root=args.data_root, workers=args.workers, progress=tqdm,
                        force=args.force, only=args.only, dry_run=args.dry_run, executor=args.executor,
                        ray_address=args.ray_address, reuse=reuse)
    if summary.seeded:
        say(f"suite {suite.name}: {summary.seeded} cell(s) seeded from {args.out}/results.json")
    if summary.reused:
        say(f"suite {suite.name}: {summary.reused} cell(s) copied from --reuse")
    if summary.upgraded:
        say(f"suite {suite.name}: {summary.upgraded} stored cell(s) of an older scenario schema kept as today's "
            "cells, stale until recomputed (bench/run/upgrade.py)")
    if summary.retired:   # said, never silent: a resumed leaderboard would otherwise lose rows unnoticed
        leave = "would leave" if args.dry_run else "leave"
        print(f"leakbench: note: {summary.retired} stored record(s) of suite {suite.name} match no cell of the suite "
              f"as it stands (its scenarios or their schema changed since): its pages {leave} them out and the "
              f"store keeps them; run the whole suite to recompute them", file=sys.stderr)
    if args.dry_run:
        for label, state in summary.plan:
            say(f"{'skip (done)' if state == 'done' else 'run (' + state + ')':14s} {label}")
        say(f"suite {suite.name}: {len(summary.plan) - summary.skipped} of {len(summary.plan)} selected cell(s) "
              f"would run ({summary.stale} stale); nothing was run")
        return 0
    store = Store(Path(args.out) / "leakbench.sqlite")
    from bench.run.version import staleness
    page = write_outputs(store, args.out, staleness(store.records()), today())
    store.close()
    say(f"suite {suite.name}: {summary.ok} ok, {summary.blocked} blocked, {summary.diverged} diverged, "
          f"{summary.failed} failed, "
          f"{summary.skipped} already done, {summary.stale} recomputed after a code change; leaderboard: {page}")
    for label, reason in summary.failures:
        print(f"leakbench: failed: {label}: {reason}", file=sys.stderr)
    return summary.exit_code


def check_out(out: str) -> Path:
    """--out must be (or be creatable as) a writable directory; nothing is created here."""
    if not out or "\0" in out:
        raise ValueError(f"--out {out!r} is not a usable path; pass a directory, e.g. --out {DEFAULT_OUT}")
    path = Path(out)
    for p in (path, *path.parents):
        try:
            exists = p.exists()
        except OSError as err:
            raise ValueError(f"--out '{out[:60]}' is not a usable path ({err.strerror}); pass a shorter one") from None
        if not exists:
            continue
        if not p.is_dir():
            where = "is a file" if p == path else f"lies under the file '{p}'"
            raise ValueError(f"--out '{out}' {where}, not a directory; pass a directory path")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(f"--out '{out}': '{p}' is not writable; pass a directory you can write to")
        break
    store = path / "leakbench.sqlite"
    if store.exists() and not store.is_file():
        raise ValueError(f"--out '{out}': '{store}' is not a file; move it aside or pass another --out")
    return path


def _leaderboard(args) -> int:
    from bench.run.store import Store
    from leaderboards.render import write_outputs

    path = check_out(args.out) / "leakbench.sqlite"
    if not path.exists():
        raise FileNotFoundError(f"no results store at {path}; run `leakbench run SUITE --out {args.out}` first")
    store = Store(path)
    from bench.run.version import staleness
    say(f"leaderboard: {write_outputs(store, args.out, staleness(store.records()), today())}")
    store.close()
    return 0


def _pages():
    """What verify needs of the renderer (bench/verify_cli.py Pages): a suite's page info, a scenario's ranks."""
    from bench.verify_cli import Pages
    from leaderboards.site import page_info
    from leaderboards.tables import ranks
    return Pages(page_info, ranks)


def _site(args) -> int:
    from bench.evaluation.verification import load_report, own_reports
    from bench.verify_cli import outcome_line, verified
    from bench.run.version import staleness
    from leaderboards.site import STANDARD, build_site, check_folders

    if args.date is not None:
        try:
            day.fromisoformat(args.date)
        except ValueError:
            raise ValueError(f"--date '{args.date}': expected YYYY-MM-DD, e.g. 2026-01-31") from None
    if args.verify is not None and args.verify < 0:
        raise ValueError(f"--verify {args.verify}: expected a number of sampled cells >= 0")
    date = args.date or today()
    loaded = check_folders(args.root, builtin_page_info, args.standard)
    verifications = own_reports(loaded, say)   # each folder's DIR/verification.json, verify's pieces
    for path in args.report:   # every report is checked before anything is recomputed or written
        checked = load_report(path, {d.name: records for d, records in loaded})
        verifications[next(d for d, _ in loaded if d.name == checked.folder)] = checked
    for directory, records in (loaded if args.verify is not None else []):
        report = verified(directory, records, builtin_page_info, _pages(), say, args.data_root, args.verify,
                          lambda o, d=directory: say(f"{d.name}: {outcome_line(o)}"))
        verifications[directory] = report.checked(directory.name)
    for directory, checked in verifications.items():
        if checked.count("differs"):
            print(f"leakbench: {directory.name}: {checked.count('differs')} of {len(checked.outcomes)} recomputed "
                  "cell(s) differ from what it stores; nothing was published", file=sys.stderr)
            return 1
    front = build_site(args.root, builtin_page_info, date, staleness, loaded, verifications, args.standard or STANDARD)
    say(f"site: {front}")
    return 0


def today() -> str:
    """The generation date a page prints: today, UTC (YYYY-MM-DD)."""
    return datetime.now(timezone.utc).date().isoformat()


def committed_results(suite: str) -> Path | None:
    """The committed results folder of a built-in suite in this checkout (leaderboards/results/NAME), if any."""
    from bench.run.version import ROOT

    folder = ROOT / "leaderboards" / "results" / suite
    return folder if (folder / "results.json").is_file() else None


def builtin_page_info(suite: str) -> dict | None:
    """A built-in suite's page info as its TOML has it now (notes, figures, paper rows, scenarios)."""
    import dataclasses

    from bench.registry import SUITES
    from bench.run.spec import load_suite

    if suite not in SUITES:
        return None
    loaded = load_suite(suite)
    info = loaded.page_info() | {"scenarios": {s.name: dataclasses.asdict(s) for s in loaded.scenarios}}
    del info["not_applicable"]   # known after the load-time checks only: the stored page info keeps the run's
    info["chance"] = _chance(loaded)
    return info


def _chance(suite) -> dict[str, float]:
    """Chance accuracy of each scenario on an image set whose classes are known without loading it."""
    from bench.data.checks import DataError, check_dataset
    from bench.data.loading import resolve_data_root

    out = {}
    for sc in suite.scenarios:
        try:
            classes = check_dataset(sc.dataset, resolve_data_root(None)).num_classes
        except DataError:
            continue   # data absent here: the page keeps what the run stored
        if classes:
            out[sc.name] = 1.0 / classes
    return out


def _compare(args) -> int:
    from bench.evaluation.exports import differences

    rows, common = differences(args.out_a, args.out_b)
    for row in rows:
        delta = "" if row["delta"] is None else f" ({row['delta']:+.4g})"
        say(f"{row['cell']}  {row['metric']}: {row['a']} -> {row['b']}{delta}")
    say(f"{len(rows)} difference(s) between {args.out_a} and {args.out_b} over {common} common cell(s) "
        "(cells matched by id)")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:   # a print outside `say` (--help, --version) into a closed stdout
        _stdout_closed()
        return 0


def _main(argv: list[str] | None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as done:   # --help, --version, or a one-line usage error (already printed)
        sys.stdout.flush()       # here, where a closed stdout is caught, rather than at exit
        return int(done.code or 0)
    try:
        if args.command == "list":
            return _list(args.kind)
        if args.command == "run":
            return _run(args)
        if args.command == "site":
            return _site(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "verify":
            from bench.verify_cli import verify_command
            return verify_command(args, builtin_page_info, _pages(), say)
        return _leaderboard(args)
    except Exception as err:
        if not isinstance(err, _user_errors()):
            raise
        print(f"leakbench: error: {err}", file=sys.stderr)
        return 2


USER_ERRORS = {"bench.data.loading": "DataError", "bench.federation.scenario": "SpecError",
               "bench.protocol.contracts": "ContractError", "bench.run.store": "StoreError"}


def _user_errors() -> tuple[type[BaseException], ...]:
    """Bad input, reported in one line with exit status 2. An error class whose module was never imported cannot
    have been raised, so only loaded modules are asked: a failing `list` or `compare` does not load torch."""
    loaded = tuple(getattr(sys.modules[m], name) for m, name in USER_ERRORS.items() if m in sys.modules)
    return loaded + (UnknownName, PluginError, FileNotFoundError, ValueError)


if __name__ == "__main__":
    sys.exit(main())
