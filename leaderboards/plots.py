"""Per-scenario plots drawn from a built table: privacy vs cost and privacy vs utility, ROC curves.

Privacy is the table's ranking key (the strongest attack's worst case). Every defense is a
labelled point; the Pareto frontier (no other defense leaks less at a better cost/utility) is
drawn as a step line; defenses whose attacks were all blocked sit on the floor of the axis
(marker v, "blocked"), so fully encrypted rows appear instead of vanishing; the random-guess
reference row, when the suite ran one, is a dashed line. Membership attacks that stored raw
scores (details "scores", "labels") get log-log ROC curves (ML Privacy Meter's view of the
low-FPR regime). PNGs carry no metadata, so rendering is deterministic.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from leaderboards.schema import family
from leaderboards.tables import attack_label, is_number

TRADEOFFS = (("upload_bytes", "cost", "upload bytes per client per round (log)", True),
             ("accuracy", "utility", "test accuracy of the global model", False))


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight", metadata={"Software": None})


def pareto(points: list[tuple[float, float]], x_lower: bool, y_lower: bool) -> list[tuple[float, float]]:
    """Non-dominated points, sorted by x from best to worst."""
    sx, sy = (1 if x_lower else -1), (1 if y_lower else -1)
    front, best = [], None
    for x, y in sorted(points, key=lambda p: (sx * p[0], sy * p[1])):
        if best is None or sy * y < best:
            front.append((x, y))
            best = sy * y
    return front


def tradeoff(table: dict[str, Any], x_key: str, x_label: str, log_x: bool, path: Path) -> bool:
    """One privacy-vs-x plot; False when the table has no ranking key or no row has x."""
    key = table["groups"][0].columns[0] if table["groups"] and table["groups"][0].name == "strongest" else None
    if key is None:
        return False
    y_lower = key.lower_is_better is not False
    pts, floor = [], []
    for row in table["rows"]:
        run = next((r for r in row["records"] if is_number(r["metrics"].get(x_key))), None)
        if run is None:
            continue
        cell = row["cells"][0]
        if cell["cls"] == "blocked":
            floor.append((run["metrics"][x_key], row["defense"]))
        elif is_number(cell["sort"]):
            pts.append((run["metrics"][x_key], cell["sort"], row["defense"]))
    if not pts and not floor:
        return False
    reference = [r["metrics"][key.key] for row in table["rows"] for r in row["records"]
                 if family(r) == "reference" and is_number(r["metrics"].get(key.key))]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    ys = [p[1] for p in pts] + ([sum(reference) / len(reference)] if reference else [])
    span = (max(ys) - min(ys)) if len(ys) > 1 else 1.0
    if not ys:
        bottom = 0.0
    else:  # the protected end of the axis: below the least leakage, or above it when higher is safer
        bottom = min(ys) - 0.12 * (span or 1.0) if y_lower else max(ys) + 0.12 * (span or 1.0)
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=40, color="#1f77b4", zorder=3)
        front = pareto([(p[0], p[1]) for p in pts], x_lower=(x_key != "accuracy"), y_lower=y_lower)
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="#d62728", lw=1.2,
                label="Pareto frontier", zorder=2)
    for x, y, name in pts:
        ax.annotate(name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    for x, name in floor:
        ax.scatter([x], [bottom], marker="v", s=50, color="#2ca02c", zorder=3)
        ax.annotate(f"{name} (blocked)", (x, bottom), fontsize=7, xytext=(4, 3), textcoords="offset points")
    if reference:
        ax.axhline(sum(reference) / len(reference), ls="--", color="#777", lw=1, label="random guess")
    if log_x and all(p[0] > 0 for p in pts) and all(f[0] > 0 for f in floor):
        ax.set_xscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"strongest attack: {key.header}" + (f" ({key.unit})" if key.unit else "") + f" {key.arrow}")
    if pts or reference:
        ax.legend(fontsize=7, loc="best", frameon=False)
    _save(fig, path)
    plt.close(fig)
    return True


def roc(records: list[dict[str, Any]], path: Path) -> bool:
    """Log-log ROC of every membership cell that stored raw scores."""
    curves = [r for r in records if r["status"] == "ok" and r["details"].get("scores") and r["details"].get("labels")]
    if not curves:
        return False
    import numpy as np
    from sklearn.metrics import roc_curve

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.6))
    floor = 1.0
    for rec in curves:
        labels = np.asarray(rec["details"]["labels"])
        scores = np.asarray(rec["details"]["scores"], dtype=float)
        keep = np.isfinite(scores)
        if len(set(labels[keep].tolist())) < 2:
            continue
        fpr, tpr, _ = roc_curve(labels[keep], scores[keep])
        floor = min(floor, 1.0 / max(1, int((labels[keep] == 0).sum())))
        ax.plot(np.maximum(fpr, floor / 2), np.maximum(tpr, floor / 2), lw=1,
                label=f"{rec['defense']} · {attack_label(rec)}")
    grid = np.logspace(np.log10(floor / 2), 0, 50)
    ax.plot(grid, grid, ls="--", color="#777", lw=1, label="random guess")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("false positive rate (log)")
    ax.set_ylabel("true positive rate (log)")
    ax.legend(fontsize=6, loc="lower right", frameon=False)
    _save(fig, path)
    plt.close(fig)
    return True


def scenario_plots(table: dict[str, Any], records: list[dict[str, Any]], out: Path, stem: str) -> list[dict]:
    """Every plot that applies to one scenario; paths relative to out."""
    made = []
    for x_key, kind, label, log_x in TRADEOFFS:
        name = f"plots/{stem}--privacy-vs-{kind}.png"
        if tradeoff(table, x_key, label, log_x, out / name):
            made.append({"path": name, "title": f"privacy vs {kind}"})
    name = f"plots/{stem}--roc.png"
    if roc([r for r in records if family(r) == "membership"], out / name):
        made.append({"path": name, "title": "membership ROC (log-log)"})
    return made
