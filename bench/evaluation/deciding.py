"""Which stored cells decide what a page shows, read from the page's structure and never from the values the
cells store, since whoever forged a record chose those: `leakbench verify` recomputes these cells by default.

Per scenario, a page (its table, and the front page's grid and summary, built from the same records by the same
rules) decides:

- verdicts, ranks and summary cells: a row's verdict is the most severe band over every value of every
  calibrated attack measured on it (bench/evaluation/calibration.py), its rank the worst case of its strongest
  column, a summary cell the worst over one family and stage. Which cell is the worst is a stored value, so every
  cell of a calibrated attack on every row can decide one and all of them are chosen, whatever they store
  (blocked and diverged ones too: their status decides the cell);
- calibration: whether an attack judges at all is read from the undefended rows' cells, so every cell of an
  undefended row is chosen. A forgery that moves calibration is then itself a chosen cell, and since a chosen
  cell reproduces only in its stored verdict band, the calibration this selection read is the one that holds;
- utility: the cell a row's utility is read from (`run_of`), the cell whose run-level values its table row shows
  (its first finished cell), every cell that flags its row "no utility" where the scenario measures utility (any
  one cell raises the flag, so a cell that does not raise it decides nothing about it; lowering a flag means
  changing the utility cell, which is chosen) and the untrained rows' cells whose perplexity is the yardstick;
- HE cost: per row of a suite, its first cell with an HE time and every cell with a positive one, since the page
  shows the largest with its upload size (times are never compared; the upload is);
- prose: every cell whose number a suite's notes quote (bench/evaluation/pages.py references).

Reference attacks (floors such as random guessing) and attacks that fail on the undefended row decide nothing:
their cells are shown but judge nothing; `leakbench verify --sample N` draws from them.
"""
from __future__ import annotations

from typing import Any, Callable

from bench.evaluation.calibration import calibrate
from bench.evaluation.formats import is_number
from bench.evaluation.pages import REFERENCE, named_cells, parsed_reference
from bench.evaluation.schema import attack_label, defense_label, family, undefended
from bench.evaluation.usefulness import measures_utility, no_utility, yardsticks
from bench.evaluation.utility_loss import run_of

HE_TIME = ("he_encrypt_s", "he_aggregate_s", "he_decrypt_s")   # a row's HE cost per round, as the front page sums it


def deciding_cells(records: list[dict[str, Any]], infos: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Cell id -> what the cell decides on its suite's page (the first reason found), for every cell that decides
    something; `infos`: each suite's page info (untrained rows, chance accuracy, notes)."""
    out: dict[str, str] = {}

    def add(rec: dict[str, Any], why: str) -> None:
        out.setdefault(rec["cell_id"], why)

    for suite in dict.fromkeys(r["suite"] for r in records):
        mine = [r for r in records if r["suite"] == suite]
        info = infos.get(suite) or {}
        for scenario in dict.fromkeys(r["scenario"] for r in mine):
            recs = [r for r in mine if r["scenario"] == scenario]
            _judging(recs, add)
            _utility(recs, info, scenario, add)
        _he(mine, add)
        _quoted(mine, info.get("notes") or "", suite, add)
    return out


def _judging(recs: list[dict[str, Any]], add: Callable) -> None:
    cal = calibrate(recs, attack_label)
    for rec in recs:
        attack = attack_label(rec)
        if family(rec) in ("reference", ""):
            continue
        if undefended(rec):
            add(rec, f"calibration: the undefended row {defense_label(rec)} tells whether {attack} judges")
        elif attack in cal and cal[attack].ok:
            add(rec, f"verdict and rank: {attack} is calibrated, so this cell can be its row's worst case")


def _utility(recs: list[dict[str, Any]], info: dict[str, Any], scenario: str, add: Callable) -> None:
    untrained_names = set(info.get("untrained") or ())
    chance, untrained = yardsticks(recs, info, scenario)
    measured = measures_utility(recs, info, scenario, defense_label)
    for row in dict.fromkeys(defense_label(r) for r in recs):
        mine = [r for r in recs if defense_label(r) == row]
        if (shown := run_of(mine)) is not None:
            add(shown, f"utility: the cell {row}'s utility is read from")
        run = next((r for r in mine if r["status"] == "ok"), next((r for r in mine if r["metrics"]), mine[0]))
        add(run, f"run-level values: the cell {row}'s table row shows them from")
        for rec in mine:
            if rec["defense"] in untrained_names:
                if is_number(rec["metrics"].get("perplexity")):
                    add(rec, "utility yardstick: the untrained model's perplexity")
            elif measured and no_utility(rec, chance, untrained):
                add(rec, f"no-utility flag: this cell flags {row}")


def _he(mine: list[dict[str, Any]], add: Callable) -> None:
    for row in dict.fromkeys(defense_label(r) for r in mine):
        timed = [r for r in mine if defense_label(r) == row and any(is_number(r["metrics"].get(k)) for k in HE_TIME)]
        for i, rec in enumerate(timed):
            if i == 0 or any(is_number(v := rec["metrics"].get(k)) and v > 0 for k in HE_TIME):
                add(rec, f"HE cost: a candidate for {row}'s largest HE time and its upload size")


def _quoted(mine: list[dict[str, Any]], notes: str, suite: str, add: Callable) -> None:
    full = {f"{r['scenario']}/{defense_label(r)}/{attack_label(r)}": r for r in mine}
    bare: dict[str, list[dict[str, Any]]] = {}
    for r in mine:
        bare.setdefault(f"{r['scenario']}/{r['defense']}/{r['attack']}", []).append(r)
    for match in REFERENCE.finditer(notes):
        words, _ = parsed_reference(match, suite)
        for rec in named_cells(words[0], full, bare):
            add(rec, f"prose: the suite's notes quote its {words[1]}")
