"""Learning-rate sensitivity from an LR × rule sweep (``experiment=lr_sensitivity``).

Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities", §3.1) define a setting's LR sensitivity as

    E_η [ min(ℓ(η), ℓ₀) − ℓ* ]

over a log-spaced grid of learning rates η: ℓ(η) the final loss at η, ℓ₀ the loss at
initialisation, ℓ* the best final loss over the grid. A run that diverged counts as ℓ₀
(its loss is capped there), so instability raises the sensitivity as much as a bad loss.
Here ℓ(η) is the final ``val/loss``, ℓ₀ the ``train/loss`` at step 0 (before any update;
the experiment turns label smoothing off so the two are the same quantity), and the
sensitivity is computed per seed, then averaged (± std over seeds).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnlab.report.figures import COLOURS, plt, save
from attnlab.report.runs import Run

LR = "optim.lr"


def setting_of(run: Run, axes: list[str]) -> str:
    """The run's configuration without the LR and the seed (a rule, usually)."""
    others = [key for key in axes if key not in (LR, "seed")]
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={run.config.get(key)}" for key in others) or "all runs"


def collect(runs: list[Run], axes: list[str]) -> dict:
    """{setting: {seed: {lr: (final loss or None if it diverged, ℓ₀)}}} over runs that ended."""
    table: dict = {}
    for run in runs:
        if run.status not in ("finished", "diverged") or LR not in run.config:
            continue
        initial = next((value for step, value in zip(*run.series("train/loss"), strict=True) if step == 0), None)
        final = run.last("val/loss") if run.status == "finished" else None
        if final is not None and not math.isfinite(final):
            final = None
        seeds = table.setdefault(setting_of(run, axes), {})
        seeds.setdefault(run.config.get("seed"), {})[float(run.config[LR])] = (final, initial)
    return table


def applies(runs: list[Run], axes: list[str]) -> bool:
    return LR in axes and any(len(lrs) >= 3 for seeds in collect(runs, axes).values() for lrs in seeds.values())


def sensitivity(losses: dict[float, tuple[float | None, float | None]]) -> tuple[float, float, float, float] | None:
    """(sensitivity, ℓ*, best η, ℓ₀) of one seed's grid; None without ℓ₀ or any finished run."""
    initials = [initial for _, initial in losses.values() if initial is not None]
    finals = {lr: final for lr, (final, _) in losses.items() if final is not None}
    if not initials or not finals:
        return None
    start = float(np.mean(initials))  # the same model at init for every η: equal up to float noise
    best_lr = min(finals, key=finals.get)
    best = finals[best_lr]
    return float(np.mean([capped(final, start) - best for final, _ in losses.values()])), best, best_lr, start


def capped(final: float | None, start: float) -> float:
    """min(ℓ(η), ℓ₀), a diverged run (None) counting as ℓ₀."""
    return start if final is None else min(final, start)


def lr_table(runs: list[Run], axes: list[str]) -> list[str]:
    if not applies(runs, axes):
        return []
    lines = [
        "## Learning-rate sensitivity (Wortsman et al. 2023)",
        "",
        "Sensitivity = E_η[min(ℓ(η), ℓ₀) − ℓ*] over the LR grid: ℓ(η) the final `val/loss`, ℓ₀ the "
        "`train/loss` at step 0, ℓ* the best final loss; a diverged run counts as ℓ₀. Per seed, then "
        "mean ± std over seeds; lower = less sensitive to the choice of LR.",
        "",
        "| setting | seeds | LRs | diverged | best LR | ℓ* | ℓ₀ | sensitivity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for setting, seeds in sorted(collect(runs, axes).items()):
        results = [result for losses in seeds.values() if (result := sensitivity(losses))]
        if not results:
            continue
        values, bests, best_lrs, starts = (np.array(column) for column in zip(*results, strict=True))
        lrs = sorted({lr for losses in seeds.values() for lr in losses})
        diverged = sum(final is None for losses in seeds.values() for final, _ in losses.values())
        spread = f" ± {values.std(ddof=1):.3f}" if len(values) > 1 else ""
        best_lr = "/".join(f"{lr:g}" for lr in sorted(set(best_lrs)))
        grid = f"{lrs[0]:g} … {lrs[-1]:g} ({len(lrs)})"
        lines.append(f"| {setting} | {len(results)} | {grid} | {diverged} | {best_lr} | {bests.mean():.3f} | "
                     f"{starts.mean():.3f} | {values.mean():.3f}{spread} |")  # fmt: skip
    return [*lines, ""]


def lr_figure(runs: list[Run], axes: list[str], out: Path) -> Path | None:
    """Final loss against LR (log x), one line per setting: mean over seeds, ± std shaded;
    diverged runs drawn at ℓ₀ with a cross."""
    if not applies(runs, axes):
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for index, (setting, seeds) in enumerate(sorted(collect(runs, axes).items())):
        colour = COLOURS[index % len(COLOURS)]
        lrs = sorted({lr for losses in seeds.values() for lr in losses})
        curves = []
        for losses in seeds.values():
            result = sensitivity(losses)
            start = result[3] if result else np.nan
            curves.append([capped(losses[lr][0], start) if lr in losses else np.nan for lr in lrs])
            crosses = [lr for lr in lrs if lr in losses and losses[lr][0] is None]
            ax.plot(crosses, [start] * len(crosses), "x", color=colour, ms=8)
        values = np.array(curves, dtype=float)
        mean = np.nanmean(values, axis=0)
        ax.plot(lrs, mean, "o-", color=colour, label=setting)
        if len(curves) > 1:
            std = np.nanstd(values, axis=0)
            ax.fill_between(lrs, mean - std, mean + std, color=colour, alpha=0.2, lw=0)
    ax.set_xscale("log")
    ax.set(title="final loss against learning rate (× = diverged, drawn at ℓ₀)", xlabel="peak learning rate",
           ylabel="final val/loss, capped at ℓ₀")  # fmt: skip
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, out / "lr_sensitivity.png")
