"""Per-scenario plots drawn from a built table: privacy vs cost and privacy vs utility, ROC curves.

Privacy is the strongest attack's worst case (the table's first strongest column). Each ranked defense is a point
numbered with its rank in the table (rows that share a rank get a letter each: 2a, 2b; the key is the figure's
caption, so labels never overlap); rows the table leaves unranked are named in the caption instead. The Pareto
front (leaderboards/pareto.py: no other point is better on both axes beyond the worst case's stored 95% interval)
is marked with red rings and joined by a step line when it has two points or more; defenses whose attacks were
all blocked sit on the floor of the axis (marker v) and take part in the front as the best privacy there is, so
a blocked row at a better cost or utility takes the points it beats off the front. The random-guess reference
row, when the suite ran one, is a dashed line. A log axis is log: points it cannot hold (0 bytes) are named in the
caption instead. A plot with fewer than two points is not drawn. Membership attacks that stored raw scores get
log-log ROC curves (ML Privacy Meter's view of the low-FPR regime): one curve per defense, its strongest attack by
TPR at 1% FPR, at most eight curves a panel. Legends name only what is drawn. PNGs carry no metadata, so
rendering is deterministic.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.evaluation.formats import is_number, tick_bytes
from bench.evaluation.schema import family
from leaderboards.pareto import Point, front
from leaderboards.tables import attack_label, defense_label

TRADEOFFS = (("upload_bytes", "cost", "upload bytes per client per round", True),
             ("accuracy", "utility", "test accuracy of the global model", False))
PER_PANEL = 8


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight", metadata={"Software": None})


def numbers(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each ranked row's point label: its rank, with a letter where rows share it (2a, 2b in table order)."""
    shared: dict[Any, list[str]] = {}
    for row in rows:
        if row["rank"] != "":
            shared.setdefault(row["rank"], []).append(row["defense"])
    return {name: f"{rank}{'abcdefghijklmnopqrstuvwxyz'[i] if len(names) > 1 else ''}"
            for rank, names in shared.items() for i, name in enumerate(names)}


def _interval(cell: dict[str, Any], key: str) -> tuple[float, float] | None:
    bounds = (cell.get("record") or {}).get("details", {}).get(f"{key}_ci95")
    if isinstance(bounds, (list, tuple)) and len(bounds) == 2 and all(is_number(b) for b in bounds):
        return float(bounds[0]), float(bounds[1])
    return None


def _points(table: dict[str, Any], x_key: str):
    """(key column, placed points, blocked points, unranked rows with a value): a point is (x, y, y interval, row
    name), a blocked one (x, row name)."""
    key = table["groups"][0].columns[0] if table["groups"] and table["groups"][0].kind == "strongest" else None
    pts, floor, unranked = [], [], []
    if key is None:
        return None, pts, floor, unranked
    for row in table["rows"]:
        run = next((r for r in row["records"] if is_number(r["metrics"].get(x_key))), None)
        if run is None:
            continue
        cell = row["cells"][0]
        placeable = cell["cls"] == "blocked" or is_number(cell["sort"])
        if placeable and row["rank"] == "":
            unranked.append(row["defense"])
        elif cell["cls"] == "blocked":
            floor.append((run["metrics"][x_key], row["defense"]))
        elif is_number(cell["sort"]):
            pts.append((run["metrics"][x_key], cell["sort"], _interval(cell, key.key), row["defense"]))
    return key, pts, floor, unranked


def pareto_front(pts: list[tuple], floor: list[tuple], lower_x: bool, lower_y: bool) -> list[tuple[float, str]]:
    """The (x, name) of every point no other beats on both axes (leaderboards/pareto.py), blocked points included
    as better than any measured value, sorted by x from best to worst."""
    best = float("-inf") if lower_y else float("inf")
    points = [Point(x, y, None, ci) for x, y, ci, _ in pts] + [Point(x, best) for x, _ in floor]
    names = [p[-1] for p in pts] + [f[-1] for f in floor]
    flags = front(points, lower_x, lower_y)
    on = [(p.x, name) for p, name, flag in zip(points, names, flags) if flag]
    return sorted(on, key=lambda t: t[0] if lower_x else -t[0])


def tradeoff(table: dict[str, Any], x_key: str, x_label: str, log_x: bool, path: Path) -> dict[str, Any] | None:
    """One privacy-vs-x plot and its caption's key; None when fewer than two defenses can be placed."""
    key, pts, floor, unranked = _points(table, x_key)
    if key is None or len(pts) + len(floor) < 2:
        return None
    left_out = []
    if log_x:
        kept_pts, kept_floor = [p for p in pts if p[0] > 0], [f for f in floor if f[0] > 0]
        if len(kept_pts) + len(kept_floor) >= 2:
            left_out = [p[-1] for p in pts + floor if p[0] <= 0]
            pts, floor = kept_pts, kept_floor
        else:
            log_x = False
    y_lower = key.lower_is_better is not False
    reference = [r["metrics"][key.key] for row in table["rows"] for r in row["records"]
                 if family(r) == "reference" and is_number(r["metrics"].get(key.key))]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ys = [p[1] for p in pts] + ([sum(reference) / len(reference)] if reference else [])
    span = (max(ys) - min(ys)) if len(ys) > 1 else 1.0
    bottom = 0.0 if not ys else (min(ys) - 0.12 * (span or 1.0) if y_lower else max(ys) + 0.12 * (span or 1.0))
    label = numbers(table["rows"])
    at = {name: y for _, y, _, name in pts} | {name: bottom for _, name in floor}
    placed = {name for *_, name in pts} | {name for _, name in floor}
    labelled = False
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=36, color="#1f77b4", zorder=3)
    on_front = pareto_front(pts, floor, lower_x=(x_key != "accuracy"), lower_y=y_lower)
    if on_front:
        xs, fys = [x for x, _ in on_front], [at[name] for _, name in on_front]
        if len(on_front) >= 2:
            ax.step(xs, fys, where="post", color="#d62728", lw=1.2, zorder=2)
        ax.scatter(xs, fys, s=110, facecolors="none", edgecolors="#d62728", lw=1.2, zorder=4, label="Pareto front")
        labelled = True
    if floor:
        ax.scatter([f[0] for f in floor], [bottom] * len(floor), marker="v", s=46, color="#2ca02c", zorder=3,
                   label="blocked by design")
        labelled = True
    anchors = [(x, y, name) for x, y, _, name in pts] + [(x, bottom, name) for x, name in floor]
    for (x, y), names in _close(anchors, log_x).items():   # points on one spot share one label: "3a, 3b"
        ax.annotate(", ".join(label[n] for n in names), (x, y), fontsize=8, xytext=(4, 3), textcoords="offset points")
    if reference:
        ax.axhline(sum(reference) / len(reference), ls="--", color="#777", lw=1, label="random guess")
        labelled = True
    if log_x:
        ax.set_xscale("log")
    else:
        ax.ticklabel_format(axis="x", useOffset=False, style="plain")
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    if x_key.endswith("bytes"):
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
        if log_x:   # labelled ticks at 1, 2, 5 x 10^k only: no crowded minor labels
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: tick_bytes(v)))
    ax.set_xlabel(x_label + (" (log scale)" if log_x else ""))
    unit = f" ({key.shown_unit})" if key.shown_unit else ""
    ax.set_ylabel(f"worst case: {key.header}{unit} {key.arrow}")
    if labelled:
        ax.legend(fontsize=8, loc="best", frameon=False)
    _save(fig, path)
    plt.close(fig)
    return {"key": [{"n": label[row["defense"]], "name": row["defense"]} for row in table["rows"]
                    if row["defense"] in placed],
            "front": [name for _, name in on_front], "unranked": unranked, "left_out": left_out}


def _close(anchors: list[tuple[float, float, str]], log_x: bool) -> dict[tuple[float, float], list[str]]:
    """Points within 2% of the axes' spans of an earlier one, grouped under its position."""
    import math

    def norm(x):
        return math.log10(x) if log_x and x > 0 else x

    xs, ys = [norm(a[0]) for a in anchors], [a[1] for a in anchors]
    sx, sy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    groups: dict[tuple[float, float], list[str]] = {}
    for (x, y, name), nx in zip(anchors, xs):
        spot = next((k for k in groups if abs(norm(k[0]) - nx) < 0.02 * sx and abs(k[1] - y) < 0.02 * sy), (x, y))
        groups.setdefault(spot, []).append(name)
    return groups


def _strength(labels, scores) -> tuple[float, float]:
    """(TPR at FPR <= 1%, AUROC) of one score vector: how a panel picks a defense's strongest attack."""
    from sklearn.metrics import roc_auc_score, roc_curve
    fpr, tpr, _ = roc_curve(labels, scores)
    return float(max(tpr[fpr <= 0.01], default=0.0)), float(roc_auc_score(labels, scores))


def roc(records: list[dict[str, Any]], out: Path, stem: str) -> list[dict[str, Any]]:
    """Log-log ROC panels: per defense, the curve of its strongest attack that stored raw scores."""
    import numpy as np

    best: dict[str, tuple] = {}
    for rec in records:
        if rec["status"] != "ok" or not rec["details"].get("scores") or not rec["details"].get("labels"):
            continue
        labels = np.asarray(rec["details"]["labels"])
        scores = np.asarray(rec["details"]["scores"], dtype=float)
        keep = np.isfinite(scores)
        labels, scores = labels[keep], scores[keep]
        if len(set(labels.tolist())) < 2:
            continue
        strength = _strength(labels, scores)
        name = defense_label(rec)
        if name not in best or strength > best[name][0]:
            best[name] = (strength, attack_label(rec), labels, scores)
    if not best:
        return []
    from sklearn.metrics import roc_curve
    plt = _pyplot()
    names = list(best)
    panels = []
    for k in range(0, len(names), PER_PANEL):
        chunk = names[k:k + PER_PANEL]
        fig, ax = plt.subplots(figsize=(8.2, 4.6))
        floor = 1.0
        for i, name in enumerate(chunk):
            (tpr1, auc), attack, labels, scores = best[name]
            fpr, tpr, _ = roc_curve(labels, scores)
            floor = min(floor, 1.0 / max(1, int((labels == 0).sum())))
            ax.plot(np.maximum(fpr, floor / 2), np.maximum(tpr, floor / 2), lw=1.3, color=f"C{i}",
                    label=f"{name} · {attack} (AUROC {auc:.2f}, TPR@1% {tpr1:.2f})")
        grid = np.logspace(np.log10(floor / 2), 0, 50)
        ax.plot(grid, grid, ls="--", color="#777", lw=1, label="random guess")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("false positive rate (log scale)")
        ax.set_ylabel("true positive rate (log scale)")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        name = f"plots/{stem}--roc{k // PER_PANEL + 1}.png"
        _save(fig, out / name)
        plt.close(fig)
        part = f" ({k // PER_PANEL + 1}/{-(-len(names) // PER_PANEL)})" if len(names) > PER_PANEL else ""
        panels.append({"path": name, "title": f"membership ROC, strongest attack per defense{part}", "key": [],
                       "left_out": []})
    return panels


def scenario_plots(table: dict[str, Any], records: list[dict[str, Any]], out: Path, stem: str) -> list[dict]:
    """Every plot that applies to one scenario; paths relative to out."""
    made = []
    for x_key, kind, label, log_x in TRADEOFFS:
        if kind == "utility" and table.get("privacy_only"):
            continue
        name = f"plots/{stem}--privacy-vs-{kind}.png"
        drawn = tradeoff(table, x_key, label, log_x, out / name)
        if drawn:
            made.append({"path": name, "title": f"privacy vs {kind}", **drawn})
    return made + roc([r for r in records if family(r) == "membership"], out, stem)
