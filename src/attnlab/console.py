"""What a run prints: a progress bar counted in steps, other libraries' noise filtered once,
and one summary at the end (final metrics, best checkpoint, run dir, how to sync W&B)."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

# Messages of other libraries that say nothing about this run (matched at their start).
FOREIGN_WARNINGS = (
    r"The `srun` command is available on your system but is not used",  # we are not under SLURM
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning on torch ≥ 2.9
    r"The number of training batches \(\d+\) is smaller than the logging interval",  # debug=overfit
    r"Checkpoint directory .* exists and is not empty",  # resume= reuses checkpoints/
)
FOREIGN_LOG_LINES = ("💡 Tip:",)


class StepProgressBar(RichProgressBar):
    """One bar for the whole run, counted in optimizer steps up to ``trainer.max_steps`` (the
    training stream is one endless epoch: Lightning's own bar reads "Epoch 0/-2")."""

    @property
    def total_train_batches(self) -> int:
        return self.trainer.max_steps

    def _get_train_description(self, current_epoch: int) -> str:
        return f"{'step':{len(self.validation_description)}}"

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module) -> None:
        if self.train_progress_bar_id is None:  # once: an epoch is not a unit here
            super().on_train_epoch_start(trainer, pl_module)
            self._update(self.train_progress_bar_id, trainer.global_step)  # a resumed run starts part-way

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.global_step)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def get_metrics(self, trainer: L.Trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the logger's version: not a metric
        return metrics


class DropLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(FOREIGN_LOG_LINES)


def quiet_foreign_noise() -> None:
    """Filter, once per process, what other libraries print that says nothing about the run."""
    for message in FOREIGN_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(existing, DropLines) for existing in logger.filters):
            logger.addFilter(DropLines())


def summary(run_dir: Path, trainer: L.Trainer, metrics: dict, best_path: str, started: float,
            wandb_dir: Path | None, tested: str | None = None) -> str:  # fmt: skip
    """The lines printed when a run ends well: ``metrics`` are the last validation's and the test's
    (of the ``tested`` checkpoint, where that is not the best one: the averaged)."""
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    shown = [key for key in ("val/loss", "val/acc", "val/bleu", "test/loss", "test/acc", "test/bleu") if key in metrics]
    lines = [
        f"attnlab: finished at step {trainer.global_step} in {minutes}m{seconds:02d}s: {run_dir}",
        "  " + "  ".join(f"{key} {float(metrics[key]):.4g}" for key in shown),
    ]
    if best_path:
        lines.append(f"  best checkpoint: {best_path}")
    if tested and tested != best_path and any(key.startswith("test/") for key in metrics):
        lines.append(f"  tested: {tested}")
    offline = sorted(wandb_dir.glob("offline-run-*")) if wandb_dir and wandb_dir.is_dir() else []
    if offline:
        lines.append(f"  W&B (offline): wandb sync {offline[-1]}")
    return "\n".join(lines)


def parameters_line(model) -> str:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = f", {total - trainable:,} frozen" if trainable != total else ""
    return f"attnlab: {type(model).__name__} with {total:,} parameters{frozen}"
