"""μP's coordinate check from a width × rule sweep (``experiment=coord_check``).

For every scale rule and every measured quantity (the attention logits' std per layer,
the mean |output| of every attention layer) it takes the size at a few steps against the
width d_k, on log-log axes as in the mup package's plots, and fits the growth exponent:
the slope of log(size) against log(d_k). A slope near 0 means a size independent of the
width, the property μP asks of a parametrisation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.report.figures import plt, save
from attnlab.report.runs import Run, d_k_of

STEPS = (0, 5, 10, 20)  # the steps drawn (those the runs logged); the table uses the first and the last


def quantities(runs: list[Run]) -> list[str]:
    names = set().union(*(run.metric_names() for run in runs))
    logits = sorted(name for name in names if name.startswith("attn/logit_std/"))
    outputs = sorted(name for name in names if name.startswith("act/") and name.endswith("_attn"))
    return logits + outputs


def collect(runs: list[Run]) -> dict:
    """{rule: {quantity: {d_k: {step: [value per seed]}}}} of the finished runs that logged act/*."""
    probed = [run for run in runs if any(key.startswith("act/") for key in run.metric_names())]
    finished = [run for run in probed if run.status == "finished"]
    table: dict = {}
    for run in finished:
        rule = str(run.config.get("attention.scale"))
        for quantity in quantities(finished):
            steps, values = run.series(quantity)
            cell = table.setdefault(rule, {}).setdefault(quantity, {}).setdefault(d_k_of(run.config), {})
            for step, value in zip(steps, values, strict=True):
                cell.setdefault(int(step), []).append(value)
    return table


def slope(widths: list[int], sizes: list[float]) -> float:
    """Least-squares exponent a in size ∝ d_k^a."""
    return float(np.polyfit(np.log(widths), np.log(sizes), 1)[0])


def applies(runs: list[Run]) -> bool:
    table = collect(runs)
    return any(len(widths) >= 3 for by_quantity in table.values() for widths in by_quantity.values())


def coord_table(runs: list[Run]) -> list[str]:
    """Per rule and quantity: the size at the smallest and largest width at the first and last
    step (mean over seeds), and the growth exponent in d_k at both steps (± std over seeds)."""
    table = collect(runs)
    if not applies(runs):
        return []
    lines = [
        "## Coordinate check (μP)",
        "",
        "Size against width d_k (d_model = h·d_k): the attention logits' std per layer and the mean |output| "
        "of every attention layer, at the first and the last probed step; **exponent** = slope of log(size) "
        "against log(d_k), fitted per seed (mean ± std). An exponent near 0: a size independent of the width.",
        "",
    ]
    header_done = False
    for rule, by_quantity in sorted(table.items()):
        for quantity, by_width in by_quantity.items():
            widths = sorted(by_width)
            first = min(min(by_step) for by_step in by_width.values())
            last = max(max(by_step) for by_step in by_width.values())
            if not header_done:
                steps = f"t={first} → t={last}"
                lines.append(f"| rule | quantity | d_k={widths[0]}: {steps} | d_k={widths[-1]}: {steps} | "
                             f"exponent at t={first} | exponent at t={last} |")  # fmt: skip
                lines.append("|---|---|---|---|---|---|")
                header_done = True
            sizes = []
            for width in (widths[0], widths[-1]):
                at = by_width[width]
                sizes.append(" → ".join(f"{np.mean(at[step]):.3g}" if step in at else "–" for step in (first, last)))
            exponents = [exponent_cell(by_width, widths, step) for step in (first, last)]
            lines.append(f"| {rule} | `{quantity}` | {sizes[0]} | {sizes[1]} | {exponents[0]} | {exponents[1]} |")
    return [*lines, ""]


def exponent_cell(by_width: dict, widths: list[int], step: int) -> str:
    seeds = min(len(by_width[width].get(step, [])) for width in widths)
    if seeds == 0:
        return "–"
    fits = [slope(widths, [by_width[width][step][seed] for width in widths]) for seed in range(seeds)]
    mean = round(float(np.mean(fits)), 2) + 0.0  # + 0.0: no "-0.00"
    return f"{mean:+.2f} ± {np.std(fits, ddof=1):.2f}" if len(fits) > 1 else f"{mean:+.2f}"


def coord_figure(runs: list[Run], out: Path) -> Path | None:
    """mup's layout: one panel per (quantity, rule); x = d_k, y = size, one line per step."""
    table = collect(runs)
    if not applies(runs):
        return None
    rules = sorted(table)
    names = quantities([run for run in runs if run.status == "finished"])
    fig, axes = plt.subplots(len(names), len(rules), figsize=(3.2 * len(rules) + 1.5, 2.6 * len(names)),
                             squeeze=False, sharey="row")  # fmt: skip
    colours = plt.get_cmap("viridis")
    for column, rule in enumerate(rules):
        for row, quantity in enumerate(names):
            ax = axes[row][column]
            by_width = table[rule].get(quantity, {})
            widths = sorted(by_width)
            logged = sorted(set.intersection(*(set(by_width[w]) for w in widths))) if widths else []
            steps = [step for step in STEPS if step in logged] or logged[:1]
            if logged and logged[-1] not in steps:
                steps.append(logged[-1])
            for index, step in enumerate(steps):
                means = [np.mean(by_width[w][step]) for w in widths]
                ax.plot(widths, means, "o-", ms=3, color=colours(index / max(1, len(steps) - 1)), label=f"t={step}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
            if row == 0:
                ax.set_title(f"scale={rule}")
            if column == 0:
                ax.set_ylabel(quantity.replace("attn/logit_std/", "logit std ").replace("act/", "|out| "), fontsize=8)
            if row == len(names) - 1:
                ax.set_xlabel("d_k (d_model = h·d_k)")
    fig.suptitle("coordinate check: size against width over the first steps (mean over seeds)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    legend = fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False) if handles else None
    return save(fig, out / "coord_check.png", legend)
