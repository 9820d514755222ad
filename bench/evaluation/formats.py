"""How a page writes a number: bytes as kB/MB/GB, seconds as s/ms/us, every other value with the
format its metric's schema snapshot gives; a spread (+- std) and an interval in the same unit.

Units come from the records (bench/evaluation/schema.py's Shown), so a column of bytes reads
"7.55 MB" instead of "7,554,120" and an HE time reads "10.8 ms" instead of "0.0108"; a value the record stores as
an integer (a count: clusters, test samples) reads as one, "2" and not "2.000"."""
from __future__ import annotations

from typing import Any

SELF_UNITS = ("B", "s")   # values of these units carry their unit in the cell; headers omit it
HUGE = 1e9                # from here on a value is written with three significant digits and an exponent


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sig(x: float) -> str:
    """Three significant digits without exponent notation (x >= 0)."""
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def human_bytes(value: float) -> str:
    sign, v = ("-" if value < 0 else ""), abs(value)
    if v < 1000:
        return f"{sign}{v:.0f} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        if v < scale * 1000 or unit == "TB":
            return f"{sign}{_sig(v / scale)} {unit}"
    return f"{sign}{v:.0f} B"   # pragma: no cover


def tick_bytes(value: float) -> str:
    """An axis tick in bytes: "2 MB", "500 kB" (no trailing zeros)."""
    digits, unit = human_bytes(value).split(" ")
    return (digits.rstrip("0").rstrip(".") if "." in digits else digits) + " " + unit


def human_seconds(value: float) -> str:
    sign, v = ("-" if value < 0 else ""), abs(value)
    if v == 0:
        return "0 s"
    if v >= 1:
        return f"{sign}{_sig(v)} s"
    if v >= 1e-3:
        return f"{sign}{_sig(v * 1e3)} ms"
    if v >= 1e-6:
        return f"{sign}{_sig(v * 1e6)} µs"
    return f"{sign}<1 µs"


def number(value: Any, unit: str = "", fmt: str = "{:.3f}") -> str:
    """One value as a page shows it: "–" for none, text as is, numbers by unit or by the schema's format."""
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    if unit == "B":
        return human_bytes(value)
    if unit == "s":
        return human_seconds(value)
    if is_number(value) and abs(value) >= HUGE:
        return f"{value:.3g}"   # a blown-up value (a destroyed model's perplexity) as 3.61e+20, not 21 digits
    if isinstance(value, int) and not isinstance(value, bool) and fmt.endswith("f}"):
        return f"{value:,d}" if "," in fmt else f"{value:d}"   # a count stored as a whole number: 2, not 2.000
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return f"{value:.3g}"


def spread(value: Any, std: Any, unit: str = "", fmt: str = "{:.3f}") -> str:
    """value +- std (the std left off when it is missing or exactly zero over identical repeats)."""
    text = number(value, unit, fmt)
    if is_number(value) and is_number(std) and std > 0:
        text += " ± " + number(std, unit, fmt)
    return text


def interval(bounds: Any, unit: str = "", fmt: str = "{:.3f}") -> str:
    """[lo, hi] of a stored interval, or "" when there is none."""
    if isinstance(bounds, (list, tuple)) and len(bounds) == 2 and all(is_number(b) for b in bounds):
        return f"[{number(bounds[0], unit, fmt)}, {number(bounds[1], unit, fmt)}]"
    return ""

