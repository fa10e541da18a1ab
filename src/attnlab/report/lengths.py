"""Length generalisation (``data.eval_lengths``, attnlab/lengths.py): accuracy and attention
entropy against sequence length, one line per configuration, mean ± std over seeds."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from attnlab.report.figures import COLOURS, plt, save
from attnlab.report.runs import Group, cell

METRIC = re.compile(r"^length/(?P<name>[a-z_]+)/(?:(?P<layer>[^/]+)/)?len(?P<length>\d+)$")


def lengths_of(groups: list[Group]) -> list[int]:
    names = set().union(*(run.metric_names() for group in groups for run in group.runs))
    return sorted({int(m["length"]) for name in names if (m := METRIC.match(name)) and m["name"] == "seq_acc"})


def per_run(run, name: str, length: int) -> float | None:
    """A run's value of ``name`` at ``length``: itself, or the mean over the attention layers whose
    keys are the sequence (all but a decoder's self-attention, whose keys are the target)."""
    direct = run.last(f"length/{name}/len{length}")
    if direct is not None:
        return direct
    layers = [key for key in run.metric_names() if (m := METRIC.match(key)) and m["name"] == name
              and m["layer"] and not m["layer"].startswith("dec.self.") and int(m["length"]) == length]  # fmt: skip
    values = [run.last(key) for key in layers]
    return float(np.mean(values)) if values else None


def stats(group: Group, name: str, length: int) -> tuple[float, float, int] | None:
    values = [value for run in group.runs if (value := per_run(run, name, length)) is not None]
    if not values:
        return None
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0, len(values)


def lengths_table(groups: list[Group]) -> list[str]:
    lengths = lengths_of(groups)
    if not lengths:
        return []
    lines = [
        "## Length generalisation",
        "",
        "After training, on test sets whose sequences all have one length: exact-match accuracy "
        "(`length/seq_acc`), the attention's normalised entropy H / log(keys) and each row's largest "
        "weight, both averaged over the attention layers whose keys are the sequence (encoder and "
        "cross-attention; a decoder's self-attention sees the target instead), mean ± std over seeds.",
        "",
    ]
    for name, title in (("seq_acc", "exact match"), ("entropy_norm", "normalised entropy"),
                        ("max_weight", "largest weight")):  # fmt: skip
        header = ["configuration", "n", *(f"{title} at {length}" for length in lengths)]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for group in groups:
            found = [stats(group, name, length) for length in lengths]
            count = max((f[2] for f in found if f), default=0)
            lines.append("| " + " | ".join([group.label, str(count), *(cell(f) for f in found)]) + " |")
        lines.append("")
    return lines


def lengths_figure(groups: list[Group], out: Path) -> Path | None:
    lengths = lengths_of(groups)
    if not lengths:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (("seq_acc", "exact match"), ("entropy_norm", "normalised entropy H / log n (enc., cross-attn.)"),
              ("max_weight", "largest weight per row (enc., cross-attn.)"))  # fmt: skip
    for ax, (name, title) in zip(axes, panels, strict=True):
        for index, group in enumerate(groups):
            found = [stats(group, name, length) for length in lengths]
            points = [(length, f[0], f[1]) for length, f in zip(lengths, found, strict=True) if f]
            if points:
                xs, means, stds = zip(*points, strict=True)
                ax.errorbar(xs, means, yerr=stds, fmt="o-", capsize=3, color=COLOURS[index % len(COLOURS)],
                            label=group.label)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(length) for length in lengths])
        ax.minorticks_off()
        ax.set(title=title, xlabel="length (data.eval_lengths)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save(fig, out / "length_generalisation.png")
