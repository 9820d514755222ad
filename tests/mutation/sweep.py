"""Mutation testing of the modules whose bugs change a published verdict or cost (`make mutation`; not in CI).

Each module is mutated by mutmut (pinned in pyproject's `mutation` extra) in its own copy of the working tree under
--work, one module at a time, one test process at a time, against the tests that cover it (MODULES below). A mutant
is killed when one of those tests fails on it; one that survives is either a gap (a test is added that kills it) or
equivalent (it cannot change what the code computes), and docs/mutation.md lists each survivor with its fate.

    python tests/mutation/sweep.py                      # every module, every mutant
    python tests/mutation/sweep.py --only grid,view     # modules whose path contains one of these words
    python tests/mutation/sweep.py --sample 40 --seed 0 # at most 40 mutants per module, drawn with this seed
    python tests/mutation/sweep.py --rerun out/mutation/summary.json   # only the survivors listed there, after
                                                                      # adding tests that should kill them

Writes --out/summary.json (the counts per module) and --out/<module>.survivors.txt (each survivor's diff).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# module (a file, or a package as "dir/*") -> the tests that cover it; `functions`: only mutants of these
# (mutmut's mangled names, fnmatch patterns) are run, where only part of a module decides a cost.
MODULES: dict[str, dict] = {
    "bench/evaluation/calibration.py": {"tests": ["tests/test_calibration.py"]},
    "bench/evaluation/verdicts.py": {"tests": ["tests/test_leaderboard.py", "tests/test_calibration.py"]},
    "bench/evaluation/usefulness.py": {"tests": ["tests/test_calibration.py"]},
    # test_core_slice (an end-to-end run of core's slice) also reads the grid, but its coverage run alone passed 15 min
    "leaderboards/grid.py": {"tests": ["tests/test_calibration.py", "tests/test_front_page.py"]},
    "bench/protocol/records.py": {"tests": ["tests/test_trust.py", "tests/test_rerun.py", "tests/test_store.py"]},
    "bench/protocol/view.py": {"tests": ["tests/test_view.py", "tests/test_wire_checks.py", "tests/test_targets.py"]},
    "bench/crypto/params.py": {"tests": ["tests/test_crypto.py", "tests/test_aggregation.py"],
                               "functions": ["*ǁAggregatorǁ*", "*ǁRunningSumǁ*", "*ǁDecryptorǁ*", "*x__headroom*",
                                             "*x_frame__*", "*x_unframe__*"]},
    "bench/federation/accounting.py": {"tests": ["tests/test_dp.py"]},
    "defenses/maskcrypt.py": {"tests": ["tests/test_maskcrypt_parity.py", "tests/test_he_defenses.py",
                                        "tests/test_malicious.py"]},
    "defenses/shelora/*": {"tests": ["tests/test_shelora.py", "tests/test_shelora_parity.py"]},
    "attacks/labels/ilrg.py": {"tests": ["tests/test_ilrg.py"]},
}
SOURCES = ["bench/", "defenses/", "attacks/", "metrics/", "leaderboards/"]
# what tests read besides the sources and tests/ (test_trust runs the README's commands, others read the docs)
ALSO_COPY = ["README.md", "Makefile", "docs/", ".ci/"]
KILLED = {"killed", "timeout"}
# neither killed nor survived: not reached before --timeout, or the forked test process crashed (a library that
# is not fork-safe can crash whatever the mutant), so its tests said nothing about the mutant
UNDECIDED = {"not checked", "segfault"}


def slug(module: str) -> str:
    return module.replace("/*", "").replace("/", ".").removesuffix(".py")


def copy_tree(dest: Path) -> None:
    """The working tree's tracked and untracked (not ignored) files: what is being tested, uncommitted edits too."""
    shutil.rmtree(dest, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def configure(work: Path, module: str, tests: list[str]) -> None:
    lines = ["[mutmut]", "source_paths =", *(f"    {s}" for s in SOURCES), "only_mutate =", f"    {module}",
             "also_copy =", *(f"    {p}" for p in ALSO_COPY),
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests)]
    (work / "setup.cfg").write_text("\n".join(lines) + "\n")


def mutmut(work: Path, args: list[str], timeout: float) -> None:
    """One mutmut command in its own process group; past `timeout` the whole group (its forked test processes
    too) is ended and the mutants it did not reach stay "not checked"."""
    env = {**os.environ, "PYTHONPATH": str(work / "mutants"), "LEAKBENCH_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with open(work / "mutmut.log", "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mutmut", *args], cwd=work, env=env, stdout=log, stderr=log,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            log.write(f"\nsweep: stopped after {timeout:g} s\n")


def statuses(work: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(work / "mutants")}
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work, env=env,
                         capture_output=True, text=True, check=True).stdout
    return {name.strip(): status.strip() for name, status in
            (line.rsplit(":", 1) for line in out.splitlines() if ":" in line)}


def sweep(module: str, spec: dict, args) -> dict:
    work = args.work / slug(module)
    copy_tree(work)
    configure(work, module, spec["tests"])
    # before Python starts: a PYTHONPATH entry missing at start-up is never searched, even once mutmut creates it
    (work / "mutants").mkdir()
    started = time.monotonic()
    patterns = spec.get("functions")
    if args.rerun:
        names = json.loads(args.rerun.read_text())[module]["survivors"]
        if names:   # none: nothing to rerun (an empty list would run every mutant)
            mutmut(work, ["run", "--max-children", "1", *names], args.timeout)
    elif args.sample or patterns:   # generate and collect once, then run the chosen mutants only
        mutmut(work, ["run", "--max-children", "1", "no.such.mutant*"], args.timeout)
        names = sorted(statuses(work))
        if patterns:
            import fnmatch
            names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]
        if args.sample and len(names) > args.sample:
            names = sorted(random.Random(f"{args.seed}:{module}").sample(names, args.sample))
        mutmut(work, ["run", "--max-children", "1", *names], args.timeout)
    else:
        names = None
        mutmut(work, ["run", "--max-children", "1"], args.timeout)
    found = statuses(work) if names is None or names else {}
    if names is not None:
        found = {n: s for n, s in found.items() if n in set(names)}
    undecided = {n: s for n, s in found.items() if s in UNDECIDED}
    if undecided:
        print(f"{module}: {len(undecided)} mutants undecided (not reached or crashed); see {work / 'mutmut.log'}",
              flush=True)
    found = {n: s for n, s in found.items() if s not in UNDECIDED}
    counts: dict[str, int] = {}
    for status in found.values():
        counts[status] = counts.get(status, 0) + 1
    survivors = sorted(n for n, s in found.items() if s not in KILLED)
    env = {**os.environ, "PYTHONPATH": str(work / "mutants")}
    with open(args.out / f"{slug(module)}.survivors.txt", "w") as out:
        for name in survivors:
            shown = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=work, env=env,
                                   capture_output=True, text=True).stdout
            out.write(f"### {name}: {found[name]}\n{shown}\n")
    killed = sum(counts.get(s, 0) for s in KILLED)
    return {"module": module, "tests": spec["tests"], "mutants": len(found), "killed": killed,
            "survived": len(found) - killed, "by_status": counts, "survivors": survivors, "undecided": undecided,
            "score": round(killed / len(found), 3) if found else None, "wall_s": round(time.monotonic() - started)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated words; modules whose path contains one")
    parser.add_argument("--sample", type=int, default=0, help="at most this many mutants per module (0: all)")
    parser.add_argument("--seed", default="0", help="seed of the sample")
    parser.add_argument("--rerun", type=Path, default=None,
                        help="a summary.json of an earlier sweep: run only its survivors (of the modules it holds)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one module's mutmut run may take")
    parser.add_argument("--work", type=Path, default=Path("/tmp/leakbench-mutation"))
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "mutation")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    words = [w for w in args.only.split(",") if w]
    chosen = {m: s for m, s in MODULES.items() if not words or any(w in m for w in words)}
    if args.rerun:
        chosen = {m: s for m, s in chosen.items() if m in json.loads(args.rerun.read_text())}
    if not chosen:
        sys.exit(f"--only {args.only!r} names none of: {', '.join(MODULES)}")
    summary_path = args.out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for module, spec in chosen.items():   # one at a time: each run holds one test process
        result = sweep(module, spec, args)
        summary[module] = result
        summary_path.write_text(json.dumps(summary, indent=1))
        print(f"{module}: {result['mutants']} mutants, {result['killed']} killed, {result['survived']} survived "
              f"({result['score']}), {result['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
