"""Figures of a set of runs: one colour per configuration throughout, seeds as a shaded band."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import numpy as np

from attnlab.report.runs import Group, d_k_of

COLOURS = plt.get_cmap("tab10").colors
LAYER = re.compile(r"^attn/entropy/(?P<layer>[^/]+?)$")


def colour_of(groups: list[Group]) -> dict[str, tuple]:
    return {group.label: COLOURS[i % len(COLOURS)] for i, group in enumerate(groups)}


def band(ax, group: Group, key: str, colour, label: str | None = None, style: str = "-", log: bool = False) -> bool:
    """Mean over the group's seeds at the steps they share, ± one std shaded.

    With ``log``, the geometric mean and a geometric-std band (the band of a quantity
    spanning decades stays positive and symmetric on a log axis)."""
    curves = [run.series(key) for run in group.runs]
    curves = [c for c in curves if c[0]]
    if not curves:
        return False
    steps = sorted(set.intersection(*(set(c[0]) for c in curves)))
    if not steps:
        return False
    values = np.array([[dict(zip(*c, strict=True))[s] for s in steps] for c in curves])
    if log:
        logs = np.log(np.clip(values, 1e-30, None))
        centre, low, high = (np.exp(logs.mean(0) + k * logs.std(0)) for k in (0, -1, 1))
    else:
        centre, low, high = (values.mean(0) + k * values.std(0) for k in (0, -1, 1))
    ax.plot(steps, centre, style, color=colour, label=label, lw=1.6)
    if len(curves) > 1:
        ax.fill_between(steps, low, high, color=colour, alpha=0.2, lw=0)
    return True


def layers_of(groups: list[Group]) -> list[str]:
    keys = set().union(*(run.metric_names() for group in groups for run in group.runs))
    layers = {m["layer"] for key in keys if (m := LAYER.match(key)) and not re.search(r"\.H\d+$", m["layer"])}
    kinds = {"enc": 0, "dec.self": 1, "dec.cross": 2}  # encoder first, as data flows
    return sorted(layers, key=lambda name: (int(name.rsplit("L", 1)[1]), kinds.get(name.rsplit(".L", 1)[0], 3)))


def legend_right(fig, axes):
    """One legend for the whole figure, outside the panels on the right."""
    handles, labels = axes.flat[0].get_legend_handles_labels()
    return fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False) if handles else None


def loss_curves(groups: list[Group], out: Path) -> Path:
    colours = colour_of(groups)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), squeeze=False)
    for ax, key, title in zip(axes[0], ("train/loss", "val/loss"), ("training loss", "validation loss"), strict=True):
        for group in groups:
            band(ax, group, key, colours[group.label], group.label)
        ax.set(title=title, xlabel="step", ylabel="cross-entropy (nats/token)")
        ax.grid(alpha=0.3)
    return save(fig, out / "loss.png", legend_right(fig, axes))


def per_layer(groups: list[Group], family: str, title: str, ylabel: str, out: Path, log: bool = False, extra=None):
    """One panel per attention layer; ``extra`` = (family, style) drawn dashed beside it."""
    layers = layers_of(groups)
    if not layers:
        return None
    colours = colour_of(groups)
    columns = min(3, len(layers))
    rows = -(-len(layers) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns + 2.6, 3.3 * rows + 0.6), squeeze=False, sharey=True)
    drawn = False
    for ax, layer in zip(axes.flat, layers, strict=False):
        for group in groups:
            drawn |= band(ax, group, f"{family}/{layer}", colours[group.label], group.label, log=log)
            if extra:
                band(ax, group, f"{extra[0]}/{layer}", colours[group.label], None, extra[1], log=log)
        ax.set(title=layer, xlabel="step", ylabel=ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    for ax in axes.flat[len(layers) :]:
        ax.axis("off")
    if not drawn:
        plt.close(fig)
        return None
    fig.suptitle(title)
    return save(fig, out / f"{family.replace('/', '_')}.png", legend_right(fig, axes))


def temperature(groups: list[Group], out: Path):
    """The learned τ of each layer (mean over heads), for the configurations that learn it."""
    layers = layers_of(groups)
    colours = colour_of(groups)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = False
    styles = ["-", "--", ":", "-."]
    for group in groups:
        for index, layer in enumerate(layers):
            heads = sorted({k for run in group.runs for k in run.metric_names() if k.startswith(f"attn/tau/{layer}.H")})
            if not heads:
                continue
            curves = [[run.series(key) for key in heads] for run in group.runs]
            steps = curves[0][0][0]
            mean_over_heads = np.mean([[np.mean([c[1][i] for c in run_curves]) for i in range(len(steps))]
                                       for run_curves in curves], axis=0)  # fmt: skip
            label = f"{group.label} · {layer}" if len(groups) > 1 else layer
            ax.plot(steps, mean_over_heads, styles[index % 4], color=colours[group.label], label=label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(title="learned temperature τ (mean over heads)", xlabel="step", ylabel="τ")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save(fig, out / "tau.png")


def at_init(groups: list[Group], out: Path):
    """Entropy and the gradient at the logits at step 0, against d_k, one line per scale rule."""
    layers = layers_of(groups)
    if not layers:
        return None
    by_rule: dict[str, dict[int, list[tuple[float, float, float]]]] = {}
    for group in groups:
        for run in group.runs:
            entropy = [run.at_step(f"attn/entropy/{layer}", 0.0) for layer in layers]
            grads = [run.at_step(f"grad/logits_row_median/{layer}", 0.0) for layer in layers]
            if None in entropy or None in grads:
                continue
            rule = str(run.config.get("attention.scale"))
            by_rule.setdefault(rule, {}).setdefault(d_k_of(run.config), []).append((np.mean(entropy), np.mean(grads)))
    if not by_rule:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    all_d_k = sorted({d for points in by_rule.values() for d in points})
    for index, (rule, points) in enumerate(sorted(by_rule.items())):
        d_ks = sorted(points)
        for ax, column in zip(axes, (0, 1), strict=True):
            means = [np.mean([p[column] for p in points[d]]) for d in d_ks]
            # shrinking markers: rules that start alike (sqrt_dk and learned) stay visible
            ax.plot(d_ks, means, "o-", ms=11 - 2 * index, color=COLOURS[index % len(COLOURS)], label=f"scale={rule}")
    axes[0].set(title="attention entropy at initialisation", xlabel="d_k", ylabel="nats (mean over layers)")
    axes[1].set(title="gradient at the logits at initialisation", xlabel="d_k",
                ylabel="median row ‖∂loss/∂logits‖")  # fmt: skip
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_d_k, [str(d) for d in all_d_k])
        ax.minorticks_off()
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return save(fig, out / "init_vs_dk.png")


def bleu_scores(groups: list[Group], out: Path) -> Path | None:
    """Final BLEU per configuration: each seed a dot, the mean a bar (validation and test)."""
    keys = [key for key in ("val/bleu", "test/bleu") if any(group.values(key) for group in groups)]
    if not keys:
        return None
    colours = colour_of(groups)
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 0.45 * len(groups) + 1.4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for row, group in enumerate(groups):
            found = group.values(key)
            if found:
                ax.barh(row, np.mean(found), color=colours[group.label], alpha=0.35)
                ax.plot(found, [row] * len(found), "o", color=colours[group.label], ms=4)
        ax.set_yticks(range(len(groups)), [group.label for group in groups], fontsize=8)
        ax.invert_yaxis()  # the table's order, top to bottom
        ax.set(title=f"{key} (dots: seeds, bar: mean)", xlabel="BLEU")
        ax.grid(alpha=0.3, axis="x")
    return save(fig, out / "bleu.png")


def save(fig, path: Path, legend=None) -> Path:
    fig.tight_layout()
    if legend is not None:  # make room on the right for the figure legend, however long its labels
        fig.canvas.draw()
        width = legend.get_window_extent().width / fig.dpi + 0.15
        fig.subplots_adjust(right=1 - width / fig.get_figwidth())
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def all_figures(groups: list[Group], out: Path) -> list[Path]:
    figures = [
        loss_curves(groups, out),
        bleu_scores(groups, out),
        per_layer(groups, "attn/entropy", "attention entropy per layer", "nats", out),
        per_layer(
            groups,
            "grad/logits",
            "gradient at the logits: RMS (solid) and median row norm (dashed)",
            "∂loss/∂logits",
            out,
            log=True,
            extra=("grad/logits_row_median", "--"),
        ),
        per_layer(groups, "grad/softmax_jac", "softmax Jacobian Σ a(1−a), mean over rows", "Σ a(1−a)", out, log=True),
        temperature(groups, out),
        at_init(groups, out),
    ]
    return [path for path in figures if path is not None]
