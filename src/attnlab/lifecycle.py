"""How a run ends: a validation at the last step, atomic checkpoints, and signals that save.

* ``StepSeed``: the dropout RNG reseeded from (seed, step, rank) each step, so a resumed run
  ends bit-identical to one never stopped.
* ``LastCheckpoint``: ``last.ckpt`` every ``callbacks.checkpoint_every_n_steps`` and at the
  last step, and the last step always validates, whatever ``trainer.max_steps`` and
  ``trainer.val_check_interval`` are: every run has a ``val/loss`` and a ``best.ckpt``.
* ``BestCheckpoint``: ``best.ckpt`` by the monitored metric; in a copied or moved run dir
  it keeps to its own ``checkpoints/`` (never reads, overwrites or deletes the original's).
* ``AtomicCheckpointIO``: a checkpoint is written to a temp file in the same dir and
  renamed over the old one, so a crash or a full disk never leaves a truncated
  ``last.ckpt``: the previous good one stays.
* ``GracefulStop``: SIGTERM or SIGINT (Ctrl-C) during training finishes the current step
  (and the validation in progress, if any), saves ``last.ckpt`` at that step, and ends
  the run with ``Interrupted`` (exit code 128 + signal: 143, 130) and one line saying how
  to resume. A second signal stops at once. Lightning's own SIGTERM flag carries the stop
  to every DDP rank at the same step.
  Under SLURM, USR1 and USR2 (the job's ``--signal``: submitit's time-limit signal, and
  what SLURM sends on preemption) take the same path, then hand over to submitit's
  requeue (which counts time-outs against ``max_num_timeout``) or ``scontrol requeue``:
  the restarted job continues from that ``last.ckpt`` in the same run dir (``train.py``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from attnlab.rundir import atomic_write

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)  # under SLURM: save, then requeue


def under_slurm() -> bool:
    return SLURMEnvironment.detect()


def slurm_job_id() -> str:
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (e.g. the disk is full); the previous one is intact."""


def disk_error(error: OSError, what: str, path) -> OSError:
    """The same error, naming the file; logging stops reporting its own write failures
    (on a full disk every later log line would print a "Logging error" block)."""
    logging.raiseExceptions = False
    return type(error)(error.errno, f"could not write {what} {path}: {error.strerror or error}")


class MetricsCSVLogger(CSVLogger):
    """Lightning's CSVLogger (csv/version_*/metrics.csv), whose write errors name the file
    and whose final flush on a failed run never hides the error that ended it."""

    def save(self) -> None:
        try:
            super().save()
        except OSError as error:
            raise disk_error(error, "metrics", self.experiment.metrics_file_path) from None

    def finalize(self, status: str) -> None:
        if status != "failed":
            return super().finalize(status)
        with contextlib.suppress(OSError):
            super().finalize(status)


class Interrupted(SystemExit):
    """The run was stopped by a signal after saving; ``code`` is 128 + the signal number."""

    def __init__(self, signum: int, message: str):
        super().__init__(128 + signum)
        self.signum, self.message = signum, message


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()  # serialise first: a disk error then surfaces as an OSError on write
        torch.save(checkpoint, buffer)
        try:
            atomic_write(path, buffer.getvalue())
        except OSError as error:
            kept = f"the previous {path.name} is intact" if path.exists() else "no earlier checkpoint existed"
            message = disk_error(error, "checkpoint", path).strerror
            raise CheckpointWriteError(
                error.errno,
                f"{message}; {kept}. Free space on that disk, then continue with resume={path.parent.parent}",
            ) from None


class StepSeed(Callback):
    """Dropout draws from a stream that is a pure function of (seed, step, rank), so a resumed
    run repeats exactly what an uninterrupted one would have done (the data stream already is)."""

    def __init__(self, seed: int):
        self.seed = seed

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        seed = (self.seed * 1_000_003 + trainer.global_step) * 64 + trainer.global_rank
        # The generators dropout draws from, not torch.manual_seed's every backend (≈2 ms a step).
        torch.default_generator.manual_seed(seed)
        if torch.cuda.is_initialized():
            torch.cuda.manual_seed(seed)  # this process's GPU


class LastCheckpoint(Callback):
    """last.ckpt every ``every_n_steps`` and at the last step, which also validates.

    The only writer of last.ckpt (with GracefulStop, on a signal): saved after the
    step's update and before its validation, the state a resume continues exactly.
    """

    def __init__(self, path: Path, every_n_steps: int):
        self.path, self.every_n_steps = path, every_n_steps

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        step = trainer.global_step
        last_step = trainer.max_steps > 0 and step >= trainer.max_steps
        if last_step or step % self.every_n_steps == 0:
            trainer.save_checkpoint(self.path, weights_only=False)  # the whole state: resumable
        if last_step:
            # Lightning validates before honouring should_stop (once, if this step validates
            # anyway): the last step always has val/loss and a best.ckpt.
            trainer.should_stop = True


class BestCheckpoint(ModelCheckpoint):
    def load_state_dict(self, state_dict: dict) -> None:
        here = Path(self.dirpath)

        def rebase(path):  # the same file name, in this run's own checkpoints/ dir
            return str(here / Path(path).name) if path else path

        state = {
            **state_dict,
            "dirpath": self.dirpath,
            **{
                key: rebase(state_dict.get(key))
                for key in ("best_model_path", "kth_best_model_path", "last_model_path")
            },
            "best_k_models": {rebase(path): score for path, score in state_dict.get("best_k_models", {}).items()},
        }
        super().load_state_dict(state)


class GracefulStop(Callback):
    def __init__(self, last_checkpoint: Path):
        self.last_checkpoint = last_checkpoint
        self.signum: int | None = None
        self.pending = False  # a signal that came during validation
        self.validating = False
        self.previous: dict = {}
        self.trainer: L.Trainer | None = None
        self.saved_step: int | None = None
        self.usr1_default = None
        if under_slurm() and threading.current_thread() is threading.main_thread():
            # A USR1 while the data loads would kill the job (its default action): hold it
            # until training starts, then stop at the first step. (USR2 is submitit's.)
            self.usr1_default = signal.signal(signal.SIGUSR1, self.hold)

    # --- signal handling --------------------------------------------------------------

    def hold(self, signum: int, frame) -> None:
        self.signum = signum

    def setup(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        if stage == "fit" and threading.current_thread() is threading.main_thread():
            self.trainer = trainer
            signals = STOP_SIGNALS + (REQUEUE_SIGNALS if under_slurm() else ())
            self.previous = {signum: signal.getsignal(signum) for signum in signals}  # before fit
            if self.usr1_default is not None:
                self.previous[signal.SIGUSR1] = self.usr1_default

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        # After Lightning installed its own SIGTERM handler (which stops mid-validation): ours replaces it.
        for signum in self.previous:
            signal.signal(signum, self.handle)
        if self.signum is not None:  # held since before training: stop after the first step
            self.stop_lightning(True)

    def teardown(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            if self.requeues:  # SLURM's SIGTERM after its USR signal: already stopping
                return
            self.teardown(self.trainer, None, "fit")  # the second signal: stop now
            raise KeyboardInterrupt(f"{name} received twice: stopping without saving")
        self.signum = signum
        print(f"attnlab: {name} received: saving a checkpoint after this step (send it again to stop at once)",
              file=sys.stderr, flush=True)  # fmt: skip
        if self.validating:
            self.pending = True
        else:
            self.stop_lightning(True)

    def stop_lightning(self, value: bool) -> None:
        # Lightning raises SIGTERMException at its safe points when this flag is set, and
        # broadcasts rank 0's flag to the other DDP ranks before each step.
        self.trainer._signal_connector.received_sigterm = value

    def on_validation_start(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self.validating = True
        if trainer.received_sigterm:  # let the validation finish: its metrics stay whole
            self.pending = True
            self.stop_lightning(False)

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self.validating = False
        if self.pending:
            self.pending = False
            self.stop_lightning(True)

    # --- saving at the stop -------------------------------------------------------------

    def on_exception(self, trainer: L.Trainer, pl_module, exception: BaseException) -> None:
        # Every rank gets here at the same step (saving is collective; rank 0 writes).
        if isinstance(exception, SIGTERMException) and trainer.state.fn == TrainerFn.FITTING:
            trainer.save_checkpoint(self.last_checkpoint, weights_only=False)
            self.saved_step = trainer.global_step

    def interrupted(self, run_dir: Path, step: int) -> Interrupted:
        """The exception that ends the run, with its one-line message."""
        signum = self.signum or signal.SIGTERM
        name = signal.Signals(signum).name
        saved = (
            f"{self.last_checkpoint} saved at step {self.saved_step}"
            if self.saved_step is not None
            else f"training had finished (step {step})"
        )
        if self.requeues:
            message = f"attnlab: {name} under SLURM; {saved}. Requeueing the job: it continues from there"
        else:
            message = f"attnlab: stopped by {name}; {saved}. Continue with: attnlab-train resume={run_dir}"
        return Interrupted(signum, message)

    @property
    def requeues(self) -> bool:
        return self.signum in REQUEUE_SIGNALS

    def requeue(self) -> None:
        """After saving: submitit's own handler decides (it counts time-outs against
        max_num_timeout, requeues and exits, or fails the job); else scontrol requeue."""
        handler = self.previous.get(signal.SIGUSR2)
        if getattr(handler, "__name__", "") == "checkpoint_and_try_requeue":
            handler(signal.SIGUSR2, None)
        elif int(os.environ.get("SLURM_PROCID", "0")) == 0:
            subprocess.run(["scontrol", "requeue", slurm_job_id()], check=False, timeout=60)
