"""Per-scenario plots drawn from a built table: privacy vs cost and privacy vs utility, ROC curves.

Privacy is the table's ranking key (the strongest attack's worst case). Each defense is a numbered
point (the key is the figure's caption, so labels never overlap); the Pareto frontier (no other
defense leaks less at a better cost/utility) is a step line when it has two points or more;
defenses whose attacks were all blocked sit on the floor of the axis (marker v), so fully encrypted
rows appear instead of vanishing; the random-guess reference row, when the suite ran one, is a
dashed line. A log axis is log: points it cannot hold (0 bytes) are named in the caption instead.
A plot with fewer than two points is not drawn. Membership attacks that stored raw scores get
log-log ROC curves (ML Privacy Meter's view of the low-FPR regime): one curve per defense, its
strongest attack by TPR at 1% FPR, at most eight curves a panel. Legends name only what is drawn.
PNGs carry no metadata, so rendering is deterministic.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.evaluation.formats import is_number, tick_bytes
from bench.evaluation.schema import family
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


def pareto(points: list[tuple[float, float]], x_lower: bool, y_lower: bool) -> list[tuple[float, float]]:
    """Non-dominated points, sorted by x from best to worst."""
    sx, sy = (1 if x_lower else -1), (1 if y_lower else -1)
    front, best = [], None
    for x, y in sorted(points, key=lambda p: (sx * p[0], sy * p[1])):
        if best is None or sy * y < best:
            front.append((x, y))
            best = sy * y
    return front


def _points(table: dict[str, Any], x_key: str):
    key = table["groups"][0].columns[0] if table["groups"] and table["groups"][0].kind == "strongest" else None
    pts, floor = [], []
    if key is None:
        return None, pts, floor
    for row in table["rows"]:
        run = next((r for r in row["records"] if is_number(r["metrics"].get(x_key))), None)
        if run is None:
            continue
        cell = row["cells"][0]
        if cell["cls"] == "blocked":
            floor.append((run["metrics"][x_key], row["defense"]))
        elif is_number(cell["sort"]):
            pts.append((run["metrics"][x_key], cell["sort"], row["defense"]))
    return key, pts, floor


def tradeoff(table: dict[str, Any], x_key: str, x_label: str, log_x: bool, path: Path) -> dict[str, Any] | None:
    """One privacy-vs-x plot and its caption's key; None when fewer than two defenses can be placed."""
    key, pts, floor = _points(table, x_key)
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
    numbered = {name: i for i, name in enumerate(dict.fromkeys([p[2] for p in pts] + [f[1] for f in floor]), 1)}
    labelled = False
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=36, color="#1f77b4", zorder=3)
        front = pareto([(p[0], p[1]) for p in pts], x_lower=(x_key != "accuracy"), y_lower=y_lower)
        if len(front) >= 2:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="#d62728", lw=1.2,
                    label="Pareto frontier", zorder=2)
            labelled = True
    for x, y, name in pts:
        ax.annotate(str(numbered[name]), (x, y), fontsize=8, xytext=(4, 3), textcoords="offset points")
    if floor:
        ax.scatter([f[0] for f in floor], [bottom] * len(floor), marker="v", s=46, color="#2ca02c", zorder=3,
                   label="blocked by design")
        labelled = True
        for x, name in floor:
            ax.annotate(str(numbered[name]), (x, bottom), fontsize=8, xytext=(4, 3), textcoords="offset points")
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
    return {"key": [{"n": n, "name": name} for name, n in numbered.items()], "left_out": left_out}


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
        name = f"plots/{stem}--privacy-vs-{kind}.png"
        drawn = tradeoff(table, x_key, label, log_x, out / name)
        if drawn:
            made.append({"path": name, "title": f"privacy vs {kind}", **drawn})
    return made + roc([r for r in records if family(r) == "membership"], out, stem)
