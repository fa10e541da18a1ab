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
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

from attnlab.rundir import end_run, read_run_file

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
    """Context manager: rank 0 starts ranks 1..N-1, and on exit waits for (or stops) them.

    A rank that dies leaves the others waiting in a collective for good, so each side
    watches the other: rank 0 ends the job within seconds of a rank's death, naming its
    log; a rank whose rank 0 is gone exits.
    """

    def __init__(self, trainer_cfg: dict, run_dir: Path, config_file: Path, resume: bool = False):
        self.n = ddp_processes(trainer_cfg)
        self.run_dir, self.config_file, self.resume = run_dir, config_file, resume
        self.max_steps = trainer_cfg.get("max_steps")
        self.procs: list[subprocess.Popen] = []
        self.closing = threading.Event()
        external = "LOCAL_RANK" in os.environ or SLURMEnvironment.detect() or TorchElasticEnvironment.detect()
        self.active = self.n > 1 and not external

    def dead_rank(self) -> str | None:
        """Which rank died, naming its log; None while all live (or ended well, or stopped with rank 0)."""
        for rank, proc in enumerate(self.procs, start=1):
            # 0: done; 130/143: stopped by a signal together with rank 0, which is stopping too.
            if proc.poll() is not None and proc.returncode not in (0, 130, 143):
                log = self.run_dir / f"rank{rank}.log"
                return f"DDP rank {rank} exited with code {proc.returncode}; see its log {log}"
        return None

    def fail(self, reason: str) -> None:
        print(f"attnlab: {reason}. Stopping the run.", file=sys.stderr, flush=True)
        end_run(self.run_dir, "failed", read_run_file(self.run_dir).get("step", 0), reason)

    def watch_ranks(self) -> None:
        """Rank 0 blocked in a collective with a dead rank would wait for good: end it."""
        while not self.closing.wait(1.0):
            reason = self.dead_rank()
            if reason and not self.closing.is_set():
                self.fail(reason)
                for proc in self.procs:
                    proc.kill()
                os._exit(1)

    @staticmethod
    def watch_parent(parent: int) -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                print("attnlab: DDP rank 0 is gone; this rank stops", file=sys.stderr, flush=True)
                os._exit(1)

    def __enter__(self) -> Workers:
        parent = os.environ.get("ATTNLAB_DDP_PARENT")
        if parent and int(parent) == os.getppid():
            threading.Thread(target=self.watch_parent, args=(int(parent),), daemon=True).start()
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
                # every rank restores last.ckpt, and runs to the same (possibly extended) max_steps
                *([f"resume={self.run_dir}", f"trainer.max_steps={self.max_steps}"] if self.resume else []),
            ]  # fmt: skip
            child_env = {**os.environ, "LOCAL_RANK": str(rank), "ATTNLAB_DDP_PARENT": str(os.getpid())}
            self.procs.append(subprocess.Popen(command, env=child_env))
        threading.Thread(target=self.watch_ranks, daemon=True).start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.active:
            return
        self.closing.set()
        reason = self.dead_rank() if exc_type is not None else None  # rank 0 may fail first on the lost peer
        for proc in self.procs:
            if exc_type is not None:
                proc.kill()
            proc.wait()
        if reason:
            self.fail(reason)
            raise RuntimeError(reason) from exc
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()  # the next job of a sweep builds its own group
        for key in DDP_ENV:
            os.environ.pop(key, None)
        failed = [proc.returncode for proc in self.procs if proc.returncode]
        if failed and exc_type is None:
            raise RuntimeError(f"DDP worker processes exited with codes {failed}; see {self.run_dir}/rank*.log")
