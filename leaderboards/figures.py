"""Suite-declared figures: curves of one column against another, drawn with seaborn.

A suite TOML may list figures:

    [[figures]]
    title = "kde_mi vs ratio"
    x = "ratio"            # a metric, a defense or attack parameter, or defense/attack/scenario
    y = "kde_mi"
    hue = "rule"           # optional
    attack = "ilrg"        # optional filter on the attack name
    scenario = "..."       # optional filter on the scenario name
    where = { rho = 0.5 }  # optional filter on metrics or parameters
    logx = true            # optional
    series = "pruned_fraction_by_round"   # optional: plot a per-round dict from the record's details;
                                          # x and y then only title the axes

Figures are drawn from stored records only, into PNGs without metadata (deterministic). A figure
with fewer than two points is not drawn; axes carry plain numbers (no offset such as "+1e2") and
bytes in kB/MB.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.evaluation.pages import lookup

def draw(spec: dict[str, Any], records: list[dict[str, Any]], path: Path) -> bool:
    rows = []
    for rec in records:
        # run-level metrics (costs, KDE MI) are measured on blocked cells too; a missing y drops the row below
        if rec["status"] == "failed" or any(spec.get(k) and rec[k] != spec[k] for k in ("attack", "scenario", "defense")):
            continue
        if any(lookup(rec, k) != v for k, v in spec.get("where", {}).items()):
            continue
        hue = str(lookup(rec, spec["hue"])) if spec.get("hue") else ""
        if spec.get("series"):
            for step, value in sorted(rec["details"].get(spec["series"], {}).items(), key=lambda kv: int(kv[0])):
                rows.append({spec["x"]: int(step), spec["y"]: value, "hue": hue})
            continue
        x, y = lookup(rec, spec["x"]), lookup(rec, spec["y"])
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            rows.append({spec["x"]: x, spec["y"]: y, "hue": hue})
    if len(rows) < 2:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    frame = pd.DataFrame(rows).sort_values([spec["x"], "hue"])
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    sns.lineplot(data=frame, x=spec["x"], y=spec["y"], hue="hue" if spec.get("hue") else None, marker="o",
                 errorbar=None, ax=ax)
    from matplotlib.ticker import FuncFormatter

    from bench.evaluation.formats import tick_bytes
    from bench.evaluation.schema import schema_of
    schema = schema_of(records)
    for which, key in (("x", spec["x"]), ("y", spec["y"])):
        if spec.get(f"log{which}") and (frame[key] > 0).all():   # a log axis is log, or not claimed
            (ax.set_xscale if which == "x" else ax.set_yscale)("log")
        else:
            try:
                ax.ticklabel_format(axis=which, useOffset=False, style="plain")
            except AttributeError:   # a categorical axis has no offset to turn off
                pass
        if key in schema and schema[key].unit == "B":
            (ax.xaxis if which == "x" else ax.yaxis).set_major_formatter(FuncFormatter(lambda v, _: tick_bytes(v)))
    ax.set_title(spec.get("title", f"{spec['y']} vs {spec['x']}"), fontsize=10)
    if spec.get("hue"):
        ax.legend(title=spec["hue"], fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return True
