"""One table cell from stored records: a value with its spread or interval, the strongest attack's worst
case, a merged status cell, and the footnotes that say a repeated reason once per table."""
from __future__ import annotations

import statistics
from typing import Any

from bench.evaluation.formats import interval, is_number, number, spread


class Notes:
    """Footnotes of one table: each distinct reason gets one number, listed once below the table."""

    def __init__(self) -> None:
        self.texts: dict[str, int] = {}

    def add(self, text: str) -> int:
        return self.texts.setdefault(text, len(self.texts) + 1)

    def items(self) -> list[dict[str, Any]]:
        return [{"n": n, "text": t} for t, n in self.texts.items()]


def std_of(repeats: Any) -> float | None:
    """Population std over the attacked uploads, or None with fewer than two numeric repeats."""
    if isinstance(repeats, list) and len(repeats) > 1 and all(is_number(v) for v in repeats):
        return statistics.pstdev(repeats)
    return None


def value_cell(value: Any, metric, rec: dict[str, Any] | None, notes: Notes, key: str) -> dict[str, Any]:
    """A metric's value: mean +- std over the record's attacked uploads, its stored 95% interval below it;
    text (a metric recorded as unavailable, with its reason) becomes "n/a" and a footnote."""
    if isinstance(value, str):
        return {"text": "n/a", "sort": "", "cls": "na", "span": 1, "note": notes.add(value), "title": value}
    details = (rec or {}).get("details", {})
    std = std_of(details.get("per_target", {}).get(key)) if rec is not None else None
    cell = {"text": spread(value, std, metric.unit, metric.fmt), "sort": value if is_number(value) else "",
            "cls": "" if value is not None else "na", "span": 1,
            "sub": interval(details.get(f"{key}_ci95"), metric.unit, metric.fmt)}
    flag = getattr(metric, "flag_above", None)   # a warning about the setting, e.g. a split that leaks by itself
    if flag is not None and is_number(value) and value > flag:
        cell.update(cls="flagged", title=f"above {flag}: {metric.description}")
    return cell


def status_cell(status: str, reason: str, span: int, notes: Notes) -> dict[str, Any]:
    """A blocked, diverged or failed attack: one merged cell, its reason a footnote."""
    word = {"blocked": "blocked by design", "diverged": "diverged", "failed": "failed"}.get(status, status)
    text = reason or status
    if text.startswith("blocked by design: "):
        text = text[len("blocked by design: "):]
    return {"text": word, "sort": "", "cls": status, "span": span, "note": notes.add(text), "title": text}


def worst(values: list[tuple[float, dict[str, Any]]], lower_is_better: bool | None):
    """The value most favourable to the attacker: max when lower is better for the client, else min."""
    pick = min if lower_is_better is False else max
    return pick(values, key=lambda v: v[0])


def strongest_cell(col, metric, relevant: list[dict[str, Any]], label, notes: Notes) -> dict[str, Any]:
    """The worst case for the client over the attacks (of the families reporting this metric) that ran.

    "Blocked" counts as protection only when every such attack was blocked by design; one that ran,
    failed or diverged keeps the cell from reading as protected."""
    values = [(r["metrics"][col.key], r) for r in relevant
              if r["status"] == "ok" and is_number(r["metrics"].get(col.key))]
    if values:
        value, rec = worst(values, col.lower_is_better)
        cell = value_cell(value, metric, rec, notes, col.key)
        return {**cell, "by": label(rec), "record": rec}
    if any(r["status"] == "ok" for r in relevant):
        text = next((r["metrics"][col.key] for r in relevant if isinstance(r["metrics"].get(col.key), str)),
                    "ran, reported no value")
        return {"text": "n/a", "sort": "", "cls": "na", "span": 1, "note": notes.add(text), "title": text}
    for status in ("diverged", "failed"):   # a diverged training is the defense's cost, shown under utility
        hit = [r for r in relevant if r["status"] == status]
        if hit:
            return status_cell(status, hit[0]["reason"], 1, notes)
    if relevant:   # every attack of these families was blocked by design: protection
        floor = -1e300 if col.lower_is_better is not False else 1e300
        reasons = "; ".join(sorted({r["reason"].removeprefix("blocked by design: ") for r in relevant}))
        return {"text": "blocked", "sort": floor, "cls": "blocked", "span": 1, "note": notes.add(reasons),
                "title": reasons}
    return {"text": "not run", "sort": "", "cls": "na", "span": 1}


def run_cell(value: Any, metric, notes: Notes) -> dict[str, Any]:
    """A run-level value (accuracy, epsilon, bytes, time): once per defense, no spread."""
    if isinstance(value, str):
        return {"text": "n/a", "sort": "", "cls": "na", "span": 1, "note": notes.add(value), "title": value}
    return {"text": number(value, metric.unit, metric.fmt), "sort": value if is_number(value) else "",
            "cls": "" if value is not None else "na", "span": 1}
