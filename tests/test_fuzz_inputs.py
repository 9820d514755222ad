"""Fuzz of malformed inputs: suites, data roots, stores and --out paths.

Every case must end at load time with exit status 2 and exactly one stderr line that names the
fault (and, where one exists, the closest valid value), no traceback, the results already in the
store untouched and nothing written outside --out (nor inside it). Most cases call the CLI's
main() in process; a handful go through a subprocess to check the real exit status and stderr.
"""
from __future__ import annotations

import copy
import gzip
import hashlib
import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import main
from bench.registry import METRICS
from bench.run.store import Store

BASE = {"name": "fuzz", "scenarios": [{"name": "s1", "dataset": "digits", "model": "mlp", "num_clients": 2,
                                       "clients_per_round": 2, "rounds": 1, "max_train": 120, "max_test": 60}],
        "defenses": [{"name": "plaintext"}], "attacks": [{"name": "idlg", "params": {"steps": 10}}]}
NAN, INF = float("nan"), float("inf")


# ----------------------------------------------------------------------------- TOML writing
def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == INF else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)   # TOML basic strings share JSON's escapes
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def to_toml(data: dict) -> str:
    lines = [f"{json.dumps(k)} = {_value(v)}" for k, v in data.items()
             if not (isinstance(v, list) and v and all(isinstance(t, dict) for t in v))]
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
            for table in value:
                lines.append(f"[[{key}]]")
                lines += [f"{json.dumps(k)} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the cases
def _suite(edit) -> dict:
    data = copy.deepcopy(BASE)
    edit(data)
    return data


def _scenario(**fields) -> dict:
    return _suite(lambda d: d["scenarios"][0].update(fields))


def _cases() -> list[tuple[str, dict]]:
    """(id, case): case has `suite` (dict or raw bytes) or `setup`, `args`, `expect` (substrings of the
    message) and `hint` (the message must offer the closest valid value)."""
    cases: list[tuple[str, dict]] = []

    def add(cid, expect, hint=False, **case):
        cases.append((cid, {"expect": expect, "hint": hint, **case}))

    # generated: each integer field of a scenario x values out of range or of the wrong type
    ints = {"num_clients": 1, "clients_per_round": 1, "rounds": 1, "local_epochs": 1, "batch_size": 1,
            "attack_batch_size": 1, "attack_repeats": 1, "seq_len": 1, "seed": 0, "max_train": 1,
            "max_test": 1, "attack_round": 0, "attack_client": 0, "pretrain_epochs": 0, "classes_per_client": 1}
    for key, low in ints.items():
        add(f"{key}=-1", [key], hint=key not in ("attack_round", "attack_client", "pretrain_epochs"),
            suite=_scenario(**{key: low - 1 if low else -1}))
        add(f"{key}=2.5", [key, "int", "2.5"], suite=_scenario(**{key: 2.5}))
        add(f"{key}=str", [key, "int"], suite=_scenario(**{key: "3"}))
        add(f"{key}=bool", [key, "int"], suite=_scenario(**{key: True}))
    add("seed=2**40", ["seed"], hint=True, suite=_scenario(seed=2**40))
    add("attack_round=rounds", ["attack_round"], suite=_scenario(attack_round=1))
    add("attack_client=clients", ["attack_client"], suite=_scenario(attack_client=2))
    add("clients_per_round>num_clients", ["clients_per_round"], suite=_scenario(clients_per_round=3))
    # generated: each float field x non-finite, out of range, wrong type
    floats = {"lr": (NAN, INF, -INF, 0.0, -0.1), "alpha": (NAN, INF, 0.0, -1.0), "delta": (NAN, INF, 0.0, 1.0, 2.0),
              "public_fraction": (NAN, INF, -0.5, 1.0)}
    for key, values in floats.items():
        for v in values:
            add(f"{key}={v}", [key], suite=_scenario(**{key: v}))
        add(f"{key}=str", [key, "float"], suite=_scenario(**{key: "high"}))
        add(f"{key}=list", [key, "float"], suite=_scenario(**{key: [0.1]}))
    # choices and names
    for key, bad, near in (("partition", "dirichet", "dirichlet"), ("sampling", "possion", "poisson"),
                           ("attack_update", "gradients", "gradient"), ("dataset", "mnsit", "mnist"),
                           ("model", "lenet5-rel", "lenet5-relu")):
        add(f"{key}-typo", [key, bad, f"did you mean '{near}'"], hint=True, suite=_scenario(**{key: bad}))
    for where in ("suite", "scenario"):
        def named(value, where=where):
            return _suite(lambda d: d.update(name=value)) if where == "suite" else _scenario(name=value)
        add(f"{where}-name-slash", [where, "a/b", "did you mean 'a-b'"], hint=True, suite=named("a/b"))
        add(f"{where}-name-dotdot", [where, "../x", "did you mean 'x'"], hint=True, suite=named("../x"))
        add(f"{where}-name-300", [where, "not a safe file name"], hint=True, suite=named("n" * 300))
        add(f"{where}-name-nul", [where, "not a safe file name"], hint=True, suite=named("a\x00b"))
        add(f"{where}-name-empty", [where, "not a safe file name"], suite=named(""))
        add(f"{where}-name-int", [where, "name", "int"], suite=named(5))
        add(f"{where}-name-space", [where, "did you mean 'my-run'"], hint=True, suite=named("my run"))
    add("suite-name-missing", ["missing 'name'"], suite=_suite(lambda d: d.pop("name")))
    add("scenario-name-missing", ["missing required key 'name'"],
        suite=_suite(lambda d: d["scenarios"][0].pop("name")))
    add("duplicate-scenarios", ["unique"], suite=_suite(lambda d: d["scenarios"].append(dict(d["scenarios"][0]))))
    add("unknown-top-key", ["unknown key 'scenario'", "did you mean 'scenarios'"], hint=True,
        suite=_suite(lambda d: d.update(scenario=[{"name": "x"}])))
    add("unknown-scenario-key", ["unknown key 'num_client'", "did you mean 'num_clients'"], hint=True,
        suite=_scenario(num_client=3))
    add("description-int", ["description"], suite=_suite(lambda d: d.update(description=5)))
    # structure
    add("scenarios-ints", ["scenarios[0]", "table", "int"], suite=_suite(lambda d: d.update(scenarios=[1, 2])))
    add("defenses-ints", ["defenses[0]", "table", "int"], suite=_suite(lambda d: d.update(defenses=[1])))
    add("attacks-str", ["[[attacks]]"], suite=_suite(lambda d: d.update(attacks="idlg")))
    add("no-defenses", ["[[defenses]]"], suite=_suite(lambda d: d.update(defenses=[])))
    add("scenario-attacks-int", ["'attacks'", "list of names", "5"], suite=_scenario(attacks=5))
    add("scenario-attacks-substring", ["'attacks'", "list of names", "xidlgx"], suite=_scenario(attacks="xidlgx"))
    add("scenario-narrowed-unknown-defense", ["'defenses'", "nope"], suite=_scenario(defenses=["nope"]))
    add("scenario-narrowed-typo", ["plaintxt", "did you mean 'plaintext'"], hint=True,
        suite=_scenario(defenses=["plaintxt"]))
    add("scenario-narrowed-empty", ["'attacks'"], suite=_scenario(attacks=[]))
    add("attack-substring-name", ["unknown attack 'xidlgx'", "did you mean 'idlg'"], hint=True,
        suite=_suite(lambda d: d["attacks"][0].update(name="xidlgx")))
    add("defense-unknown", ["unknown defense 'plain'", "did you mean 'plaintext'"], hint=True,
        suite=_suite(lambda d: d["defenses"][0].update(name="plain")))
    add("defense-name-int", ["'name' must be a string"], suite=_suite(lambda d: d["defenses"][0].update(name=5)))
    add("attack-missing-name", ["missing 'name'"], suite=_suite(lambda d: d["attacks"][0].pop("name")))
    add("attack-unknown-key", ["unknown key 'param'"], suite=_suite(lambda d: d["attacks"][0].update(param={})))
    # component parameters: names, types, finiteness
    for value, expect, hint in ((2.5, ["steps", "integer", "did you mean 2"], True), ("10", ["steps", "integer"], False),
                                (NAN, ["steps", "integer"], False), (True, ["steps", "integer"], False)):
        add(f"steps={value!r}", expect, hint=hint, suite=_suite(lambda d, v=value: d["attacks"][0].update(params={"steps": v})))
    add("attack-param-typo", ["unknown parameter 'step'", "did you mean 'steps'"], hint=True,
        suite=_suite(lambda d: d["attacks"][0].update(params={"step": 3})))
    add("attack-param-control-char", ["label_strategy", "control character"],
        suite=_suite(lambda d: d["attacks"][0].update(params={"label_strategy": "idlg\n"})))
    dp = {"name": "dp-fedavg", "params": {"noise_multiplier": 1.0}}
    for value, expect in ((INF, ["noise_multiplier", "finite"]), (NAN, ["noise_multiplier", "finite"]),
                          ("high", ["noise_multiplier", "must be a number", "str"]),
                          ([1.0], ["noise_multiplier", "must be a number"])):
        add(f"dp-noise={value!r}", expect,
            suite=_suite(lambda d, v=value: d.update(defenses=[{**dp, "params": {"noise_multiplier": v}}])))
    add("dp-clip-str", ["clip", "number"], suite=_suite(lambda d: d.update(defenses=[{**dp, "params": {"clip": "1"}}])))
    add("sweep-not-list", ["sweep 'steps'", "non-empty list"],
        suite=_suite(lambda d: d["attacks"][0].update(sweep={"steps": 5})))
    add("sweep-empty", ["sweep 'steps'", "non-empty list"],
        suite=_suite(lambda d: d["attacks"][0].update(sweep={"steps": []})))
    add("sweep-bad-value", ["steps", "integer"], suite=_suite(lambda d: d["attacks"][0].update(sweep={"steps": [1, 1.5]})))
    add("model-param-unknown", ["model_params", "unknown parameter 'width'"], suite=_scenario(model_params={"width": 3}))
    add("model-param-type", ["model_params", "activation", "string"],
        suite=_scenario(model="lenet5-relu", model_params={"activation": 3}))
    add("model-params-not-table", ["model_params", "dict"], suite=_scenario(model_params=3))
    add("model-param-out-of-range", ["scenario 's1'", "hidden"], suite=_scenario(model="mlp-tiny",
                                                                              model_params={"hidden": -3}))
    add("lr=1e308", ["lr", "float32"], suite=_scenario(lr=1e308))
    add("workers-not-int", ["--workers", "invalid int value: 'abc'"], extra=["--workers", "abc"])
    add("membership-attack-with-mia_size-0", ["mia-loss", "mia_size = 0"],
        suite=_suite(lambda d: (d["scenarios"][0].update(mia_size=0), d.update(attacks=[{"name": "mia-loss"}]))))
    add("attack-for-another-task", ["attack 'dager'", "needs tokenized text"],
        suite=_suite(lambda d: d.update(attacks=[{"name": "dager"}])))
    # data-dependent settings
    add("attack-batch-too-large", ["attack_batch_size 500", "did you mean 60"], hint=True,
        suite=_scenario(attack_batch_size=500))
    add("max-train-below-clients", ["max_train", "clients"], hint=True, suite=_scenario(max_train=1))
    add("k-classes-too-many", ["classes_per_client 11", "did you mean 10"], hint=True,
        suite=_scenario(partition="k-classes", classes_per_client=11))
    # files
    add("toml-syntax", ["not valid TOML"], raw=b"name = \n")
    add("not-utf8", ["not UTF-8"], raw=b'name = "caf\xe9"\n')
    add("suite-dir", ["is a directory"], setup="suite-dir")
    add("suite-missing", ["does not exist"], setup="suite-missing")
    add("suite-builtin-typo", ["did you mean 'smoke'"], hint=True, args=["run", "smok"])
    add("suite-empty-name", ["empty"], args=["run", ""])
    add("suite-name-too-long", ["suite"], args=["run", "x" * 5000])
    # --out and CLI arguments
    add("out-is-file", ["--out", "is a file"], setup="out-file")
    add("out-under-file", ["--out", "under the file"], setup="out-under-file")
    add("out-store-is-dir", ["leakbench.sqlite", "not a file"], setup="out-store-dir")
    add("workers-0", ["--workers", "did you mean 1"], hint=True, extra=["--workers", "0"])
    add("workers--3", ["--workers"], hint=True, extra=["--workers", "-3"])
    add("leaderboard-out-file", ["--out", "is a file"], setup="out-file", command="leaderboard")
    add("leaderboard-no-store", ["no results store"], setup="empty-out", command="leaderboard")
    # stores
    add("store-garbage", ["corrupted or not a LeakBench store"], setup="store-garbage")
    add("store-foreign-sqlite", ["not a LeakBench store", "no LeakBench tables"], setup="store-foreign")
    add("store-wrong-schema", ["schema version"], setup="store-schema")
    add("store-garbage-leaderboard", ["corrupted"], setup="store-garbage", command="leaderboard")
    # data roots
    add("data-root-missing", ["data root", "not a directory"], data="missing")
    add("data-root-file", ["data root", "not a directory"], data="file")
    add("text-data-missing-under-root", ["dataset 'sst2'", "text/sst2/", "data root"], data="empty-root",
        suite=_scenario(dataset="sst2-sentences-cls", model="gpt2", model_params={"n_layer": 2, "n_embd": 64,
                                                                                   "n_head": 2}))
    for fault, expect in (("absent", ["needs MNIST/raw/t10k-labels-idx1-ubyte.gz"]),
                          ("truncated", ["t10k-images-idx3-ubyte.gz", "torchvision's md5"]),
                          ("garbage", ["t10k-labels-idx1-ubyte", "not a uint8 IDX"]),
                          ("short-labels", ["1000 labels for 10000 images"]),
                          ("label-255", ["t10k-labels-idx1-ubyte.gz", "label 255"]),
                          ("label-255-raw", ["label 255", "classes 0-9"]),
                          ("wrong-dims", ["28x28"]),
                          ("empty", ["t10k-labels-idx1-ubyte", "not a uint8 IDX"])):
        add(f"mnist-{fault}", expect, data=fault)
    _trust_cases(add)
    return cases


def _nested(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


def _trust_cases(add) -> None:
    """A suite's size, nesting and time limits, and the mistakes that would otherwise run silently."""
    def attacks(*tables):
        return _suite(lambda d: d.update(attacks=list(tables)))

    two = [dict(BASE["scenarios"][0]), {**BASE["scenarios"][0], "name": "s2"}]
    # size: counted before anything is enumerated, one line naming the bound and how to raise it
    add("sweep-over-20000-cells", ["20,001 attack settings", "limit of 20,000", "--max-cells"],
        suite=attacks({"name": "idlg", "sweep": {"steps": list(range(1, 20_002))}}))
    add("grid-over-max-cells", ["4 cells (2 scenario(s)", "limit of 3", "--max-cells"], extra=["--max-cells", "3"],
        suite=_suite(lambda d: d.update(scenarios=two, attacks=[{"name": "idlg", "sweep": {"steps": [1, 2]}}])))
    add("scenarios-over-max", ["2 scenarios", "limit of 1", "--max-scenarios"], extra=["--max-scenarios", "1"],
        suite=_suite(lambda d: d.update(scenarios=two)))
    add("max-cells-0", ["--max-cells must be >= 1", "20000"], extra=["--max-cells", "0"])
    add("max-cells-env-garbage", ["LEAKBENCH_MAX_CELLS", "not a whole number"], env={"LEAKBENCH_MAX_CELLS": "lots"})
    # nesting: refused before tomllib recurses (params nested 5,000 deep ended in a RecursionError)
    add("params-nested-40", ["line 15", "nest deeper than 32"],
        suite=attacks({"name": "idlg", "params": {"steps": _nested(40)}}))
    add("params-nested-5000", ["nest deeper than 32"], raw=(to_toml(BASE).replace(
        '"steps" = 10', '"steps" = ' + "[" * 5000 + "1" + "]" * 5000)).encode())
    add("model-params-nested-5000-tables", ["nest deeper than 32"], raw=(to_toml(BASE).replace(
        '"model" = "mlp"', '"model" = "mlp"\n"model_params" = ' + "{a = " * 5000 + "1" + "}" * 5000)).encode())
    # time limits
    add("cell-timeout-negative", ["cell_timeout_s", "seconds > 0", "-5"], suite=_scenario(cell_timeout_s=-5))
    add("cell-timeout-text", ["cell_timeout_s", "seconds > 0", "'1h'"], suite=_suite(lambda d: d.update(
        cell_timeout_s="1h")))
    add("cell-timeout-flag-0", ["--cell-timeout", "seconds > 0"], extra=["--cell-timeout", "0"])
    # mistakes that would run silently
    add("sweep-value-twice", ["sweep 'steps' lists 5 twice", "did you mean [5, 6]"], hint=True,
        suite=attacks({"name": "idlg", "sweep": {"steps": [5, 6, 5]}}))
    add("defense-named-twice", ["defenses[1]", "same params as defenses[0]", "remove it"],
        suite=_suite(lambda d: d.update(defenses=[{"name": "plaintext"}, {"name": "plaintext", "params": {}}])))
    add("attack-sweep-repeated", ["attacks[1]", "same params as attacks[0]"],
        suite=attacks({"name": "idlg", "sweep": {"steps": [5, 6]}}, {"name": "idlg", "sweep": {"steps": [6, 5]}}))
    add("scenario-names-differ-in-case", ["ignoring case", "'S1'", "scenarios[0]", "did you mean", "'S1-1'"],
        hint=True, suite=_suite(lambda d: d.update(scenarios=[two[0], {**two[0], "name": "S1"}])))
    add("seq_len-on-image-data", ["'seq_len' applies to text data only", "'digits' is image", "leave 'seq_len' out"],
        suite=_scenario(seq_len=64))
    add("paper-unknown-metric", ["paper[0]", "metric = 'psnrr'", "did you mean 'psnr'"], hint=True,
        suite=_suite(lambda d: d.update(paper=[{"metric": "psnrr", "reported": 20.0}])))
    add("paper-unknown-defense", ["paper[0]", "defense = 'plaintxt'", "did you mean 'plaintext'"], hint=True,
        suite=_suite(lambda d: d.update(paper=[{"metric": "psnr", "reported": 20.0, "defense": "plaintxt"}])))
    add("paper-where-unknown", ["paper[0]", "where key 'step'", "did you mean 'steps'"], hint=True,
        suite=_suite(lambda d: d.update(paper=[{"metric": "psnr", "reported": 20.0, "where": {"step": 10}}])))
    add("paper-baseline-unknown-scenario", ["paper[0]", "scenario = 's1-b'", "did you mean 's1'"], hint=True,
        suite=_suite(lambda d: d.update(paper=[{"metric": "psnr", "reported": 2.0, "baseline": {"scenario": "s1-b"}}])))
    add("figure-unknown-axis", ["figures[0]", "x = 'stepz'", "did you mean 'steps'"], hint=True,
        suite=_suite(lambda d: d.update(figures=[{"x": "stepz", "y": "psnr"}])))
    add("figure-unknown-hue", ["figures[0]", "hue = 'defence'", "did you mean 'defense'"], hint=True,
        suite=_suite(lambda d: d.update(figures=[{"x": "steps", "y": "psnr", "hue": "defence"}])))
    add("figure-unknown-attack-filter", ["figures[0]", "attack = 'idgl'", "did you mean 'idlg'"], hint=True,
        suite=_suite(lambda d: d.update(figures=[{"x": "steps", "y": "psnr", "attack": "idgl"}])))


CASES = _cases()


def test_there_are_at_least_100_cases():
    assert len(CASES) >= 200, len(CASES)


# ----------------------------------------------------------------------------- fixtures
def _seed_store(out: Path) -> None:
    store = Store(out / "leakbench.sqlite")
    store.put({"cell_id": "c0ffee", "scenario": "kept", "defense": "plaintext", "defense_params": {},
               "attack": "idlg", "attack_params": {}, "status": "ok", "reason": "", "metrics": {"psnr": 12.5},
               "details": {"family": "image", "metric_schema": {"psnr": METRICS.get("psnr").snapshot()}},
               "config": {}, "environment": {}})
    store.set_membership("earlier", ["c0ffee"], {"description": "", "notes": "", "figures": []})
    store.close()


def _fake_mnist(root: Path, fault: str) -> None:
    """A data root whose MNIST/raw links to the real files except one damaged labels/images file."""
    real = Path(os.environ["LEAKBENCH_DATA"]) / "MNIST" / "raw"
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (raw / f"{stem}.gz").symlink_to(real / f"{stem}.gz")
    labels = gzip.decompress((real / "t10k-labels-idx1-ubyte.gz").read_bytes())
    if fault == "absent":
        (raw / "t10k-labels-idx1-ubyte.gz").unlink()
    elif fault == "truncated":
        (raw / "t10k-images-idx3-ubyte.gz").unlink()
        (raw / "t10k-images-idx3-ubyte.gz").write_bytes((real / "t10k-images-idx3-ubyte.gz").read_bytes()[:50_000])
    elif fault == "garbage":
        (raw / "t10k-labels-idx1-ubyte").write_bytes(b"this is not an IDX file at all")
    elif fault == "short-labels":
        (raw / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01" + (1000).to_bytes(4, "big") + labels[8:1008])
    elif fault == "label-255":
        (raw / "t10k-labels-idx1-ubyte.gz").unlink()
        (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels[:8] + b"\xff" + labels[9:]))
    elif fault == "label-255-raw":   # uncompressed copies have a md5 too; a 255 is named either way
        (raw / "t10k-labels-idx1-ubyte").write_bytes(labels[:8] + b"\xff" + labels[9:])
    elif fault == "wrong-dims":
        (raw / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + b"".join(
            n.to_bytes(4, "big") for n in (10000, 32, 32)))
    elif fault == "empty":
        (raw / "t10k-labels-idx1-ubyte").write_bytes(b"")


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under root with a digest of its bytes (links by target)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def _prepare(case: dict, sandbox: Path) -> list[str]:
    """Lay out the sandbox (seeded store in out/, suite file, data root); return the CLI arguments."""
    out = sandbox / "out"
    out.mkdir()
    _seed_store(out)
    suite_arg = str(sandbox / "suite.toml")
    if "raw" in case:
        (sandbox / "suite.toml").write_bytes(case["raw"])
    else:
        suite = case.get("suite", BASE)
        if "data" in case and case["data"] != "empty-root":
            suite = copy.deepcopy(suite)
            suite["scenarios"][0].update(dataset="mnist", max_train=600, max_test=100)
        (sandbox / "suite.toml").write_text(to_toml(suite))
    out_arg = str(out)
    setup = case.get("setup")
    if setup == "suite-dir":
        (sandbox / "suites.toml").mkdir()
        suite_arg = str(sandbox / "suites.toml")
    elif setup == "suite-missing":
        suite_arg = str(sandbox / "missing.toml")
    elif setup == "out-file":
        (sandbox / "file").write_text("x")
        out_arg = str(sandbox / "file")
    elif setup == "out-under-file":
        (sandbox / "file").write_text("x")
        out_arg = str(sandbox / "file" / "out")
    elif setup == "out-store-dir":
        out_arg = str(sandbox / "out2")
        (sandbox / "out2" / "leakbench.sqlite").mkdir(parents=True)
    elif setup == "empty-out":
        out_arg = str(sandbox / "empty")
        (sandbox / "empty").mkdir()
    elif setup == "store-garbage":
        (out / "leakbench.sqlite").write_bytes(b"definitely not sqlite" * 100)
    elif setup == "store-foreign":
        (out / "leakbench.sqlite").unlink()
        db = sqlite3.connect(out / "leakbench.sqlite")
        db.execute("CREATE TABLE other (x INTEGER)")
        db.commit()
        db.close()
    elif setup == "store-schema":
        db = sqlite3.connect(out / "leakbench.sqlite")
        db.execute("UPDATE meta SET value='0' WHERE key='schema_version'")
        db.commit()
        db.close()
    data_args = []
    if "data" in case:
        data = sandbox / "data"
        if case["data"] == "missing":
            data_args = ["--data-root", str(sandbox / "nowhere")]
        elif case["data"] == "file":
            (sandbox / "datafile").write_text("x")
            data_args = ["--data-root", str(sandbox / "datafile")]
        elif case["data"] == "empty-root":   # a real folder without the files a text set reads
            data.mkdir()
            data_args = ["--data-root", str(data)]
        else:
            _fake_mnist(data, case["data"])
            data_args = ["--data-root", str(data)]
    command = case.get("command", "run")
    if "args" in case:
        return case["args"] + ["--out", out_arg]
    if command == "leaderboard":
        return ["leaderboard", "--out", out_arg]
    return ["run", suite_arg, "--out", out_arg, *data_args, *case.get("extra", [])]


def _check(case: dict, code: int, err: str, before: dict, after: dict) -> None:
    lines = err.strip("\n").split("\n")
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("leakbench: error: "), err
    for needle in case["expect"]:
        assert needle in lines[0], (needle, lines[0])
    if case["hint"]:
        assert "did you mean" in lines[0], lines[0]
    assert after == before, "the sandbox changed: " + str(sorted(set(after.items()) ^ set(before.items())))


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_malformed_input_fails_at_load_with_one_line(case, tmp_path, capsys, monkeypatch):
    if "data" in case and case["data"] not in ("missing", "file", "empty-root") and not os.environ.get("LEAKBENCH_DATA"):
        pytest.skip("needs the data root: set LEAKBENCH_DATA")
    sandbox = tmp_path / "box"
    sandbox.mkdir()
    argv = _prepare(case, sandbox)
    monkeypatch.chdir(sandbox)           # a relative write would land here and be caught
    for key, value in case.get("env", {}).items():
        monkeypatch.setenv(key, value)
    before = _snapshot(tmp_path)
    code = main(argv)
    captured = capsys.readouterr()
    _check(case, code, captured.err, before, _snapshot(tmp_path))
    if case.get("setup") is None or case["setup"] not in ("store-garbage", "store-foreign", "store-schema"):
        store = Store(sandbox / "out" / "leakbench.sqlite")
        assert [r["metrics"] for r in store.records("earlier")] == [{"psnr": 12.5}]
        store.close()


SUBPROCESS = ["scenarios-ints", "out-under-file", "store-foreign-sqlite", "attack-batch-too-large", "workers-not-int"]


@pytest.mark.parametrize("cid", SUBPROCESS)
def test_malformed_input_through_a_real_process(cid, tmp_path):
    case = dict(CASES)[cid]
    sandbox = tmp_path / "box"
    sandbox.mkdir()
    argv = _prepare(case, sandbox)
    before = _snapshot(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run([sys.executable, "-m", "bench", *argv], capture_output=True, text=True, cwd=sandbox,
                         env=env, timeout=300)
    _check(case, res.returncode, res.stderr, before, _snapshot(tmp_path))


def test_listed_checksums_are_torchvisions():
    tvd = pytest.importorskip("torchvision.datasets")
    from bench.data.checks import _MD5, CIFAR10_MD5
    for folder, cls in (("MNIST", tvd.MNIST), ("FashionMNIST", tvd.FashionMNIST)):
        assert {f: m for f, m in cls.resources} == {f: m for f, m in _MD5[folder].items() if f.endswith(".gz")}
    assert dict(tvd.CIFAR10.train_list + tvd.CIFAR10.test_list) == CIFAR10_MD5


def test_the_shared_data_root_passes(data_root):
    from bench.data.checks import check_dataset
    assert check_dataset("mnist", Path(data_root)).train_size == 60000
    assert check_dataset("fashion-mnist", Path(data_root)).train_size == 60000


def test_a_bad_record_is_reported_and_skipped_and_names_cannot_escape_out(tmp_path, capsys):
    """Records of an older store (unreadable JSON, a suite named with '/..') cannot poison rendering."""
    out = tmp_path / "out"
    out.mkdir()
    _seed_store(out)
    store = Store(out / "leakbench.sqlite")
    store.put({"cell_id": "bad", "scenario": "s", "defense": "plaintext", "defense_params": {}, "attack": "idlg",
               "attack_params": {}, "status": "ok", "reason": "", "metrics": {}, "details": {}, "config": {},
               "environment": {}})
    store._db.execute("UPDATE cells SET metrics='{not json' WHERE cell_id='bad'")
    store._db.execute("INSERT INTO membership VALUES ('../../escape', 'c0ffee', 0)")
    store._db.execute("INSERT INTO membership VALUES ('earlier', 'bad', 1)")
    store.close()
    before = {p for p in tmp_path.rglob("*") if not str(p).startswith(str(out))}
    assert main(["leaderboard", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "skipping unreadable record 'bad'" in err
    assert {p for p in tmp_path.rglob("*") if not str(p).startswith(str(out))} == before
    assert all(p.resolve().is_relative_to(out.resolve()) for p in out.rglob("*"))
    assert main(["leaderboard", "--out", str(out)]) == 0      # and again: the store is not poisoned
