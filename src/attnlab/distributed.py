"""Start the extra DDP processes of one run ourselves, so DDP works inside Hydra sweeps.

Lightning's own launcher re-runs ``sys.argv`` for ranks 1..N-1. Under a Hydra multirun
that argv holds ``-m`` and the whole sweep, so every child would run its own sweep in
lock-step. Instead rank 0 starts each child as a *single run* of this job's
saved, resolved config in this job's run dir, with the torchrun-style environment
(LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Lightning sees LOCAL_RANK, knows
the processes were created externally and launches nothing. Under SLURM (submitit
starts one task per GPU) or torchrun nothing is started here either.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

DDP_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def ddp_processes(trainer_cfg: dict) -> int:
    """How many processes a one-node run of this trainer config wants."""
    if not str(trainer_cfg.get("strategy", "auto")).startswith("ddp"):
        return 1
    devices = trainer_cfg.get("devices", 1)
    if devices in (-1, "auto", "-1"):
        return torch.cuda.device_count() if trainer_cfg.get("accelerator") in ("gpu", "cuda") else os.cpu_count()
    return int(devices)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Workers:
    """Context manager: rank 0 starts ranks 1..N-1, and on exit waits for (or stops) them."""

    def __init__(self, trainer_cfg: dict, run_dir: Path, config_file: Path, resume: bool = False):
        self.n = ddp_processes(trainer_cfg)
        self.run_dir, self.config_file, self.resume = run_dir, config_file, resume
        self.procs: list[subprocess.Popen] = []
        external = "LOCAL_RANK" in os.environ or SLURMEnvironment.detect() or TorchElasticEnvironment.detect()
        self.active = self.n > 1 and not external

    def __enter__(self) -> Workers:
        if not self.active:
            return self
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(self.n),
            "NODE_RANK": "0",
        }
        os.environ.update(env, LOCAL_RANK="0")
        for rank in range(1, self.n):
            command = [
                sys.executable, "-m", "attnlab.train",
                "--config-path", str(self.config_file.parent.resolve()),
                "--config-name", self.config_file.stem,
                f"hydra.run.dir={self.run_dir}",
                "hydra.output_subdir=null",  # rank 0 alone writes the run's files
                f"hydra.job.name=rank{rank}",
                *([f"resume={self.run_dir}"] if self.resume else []),  # every rank restores last.ckpt
            ]  # fmt: skip
            self.procs.append(subprocess.Popen(command, env={**os.environ, "LOCAL_RANK": str(rank)}))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.active:
            return
        for proc in self.procs:
            if exc_type is not None:
                proc.kill()
            proc.wait()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()  # the next job of a sweep builds its own group
        for key in DDP_ENV:
            os.environ.pop(key, None)
        failed = [proc.returncode for proc in self.procs if proc.returncode]
        if failed and exc_type is None:
            raise RuntimeError(f"DDP worker processes exited with codes {failed}; see {self.run_dir}/rank*.log")
