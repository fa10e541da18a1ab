"""Checkpoint averaging (Vaswani et al. 2017 §6.1: the base model is "a single model obtained
by averaging the last 5 checkpoints, which were written at 10-minute intervals").

``CheckpointAveraging`` writes the weights every ``callbacks.average.every_n_steps`` steps to
``checkpoints/average/step_<n>.ckpt``, keeping the last ``last_k``; ``write_average`` turns
them into ``checkpoints/averaged.ckpt``, the element-wise mean of their tensors, which the
test then evaluates. The snapshots are files, so a resumed run averages across its restarts.
"""

from __future__ import annotations

import io
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from attnlab.rundir import atomic_write


def average_state_dicts(state_dicts: list[dict]) -> dict:
    """The mean of each floating-point tensor over the state dicts; other entries (integer
    buffers such as counters) are taken from the last."""
    averaged = {}
    for name, last in state_dicts[-1].items():
        if torch.is_tensor(last) and last.is_floating_point():
            averaged[name] = torch.stack([state[name].double() for state in state_dicts]).mean(0).to(last.dtype)
        else:
            averaged[name] = last
    return averaged


class CheckpointAveraging(Callback):
    def __init__(self, dirpath: Path, every_n_steps: int, last_k: int):
        self.dirpath, self.every_n_steps, self.last_k = Path(dirpath), every_n_steps, last_k

    def snapshots(self) -> list[Path]:
        return sorted(self.dirpath.glob("step_*.ckpt"))

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        step = trainer.global_step
        last_step = trainer.max_steps > 0 and step >= trainer.max_steps
        if step % self.every_n_steps and not last_step:
            return
        trainer.save_checkpoint(self.dirpath / f"step_{step:08d}.ckpt", weights_only=True)  # every rank: rank 0 writes
        if trainer.is_global_zero:
            for old in self.snapshots()[: -self.last_k]:
                old.unlink()


def write_average(dirpath: Path, last_k: int, out: Path) -> list[str]:
    """``out``: the last checkpoint with its weights replaced by the mean of the last ``last_k``
    snapshots in ``dirpath``. Returns the names of the snapshots averaged."""
    files = sorted(Path(dirpath).glob("step_*.ckpt"))[-last_k:]
    if not files:
        raise FileNotFoundError(f"no checkpoints to average in {dirpath}")
    checkpoints = [torch.load(path, map_location="cpu", weights_only=False) for path in files]
    averaged = dict(checkpoints[-1])
    averaged["state_dict"] = average_state_dicts([checkpoint["state_dict"] for checkpoint in checkpoints])
    averaged["averaged_from"] = [path.name for path in files]
    buffer = io.BytesIO()
    torch.save(averaged, buffer)
    atomic_write(out, buffer.getvalue())
    return averaged["averaged_from"]
