"""Running attnlab-train from tests: in-process (Hydra compose) or as the real CLI."""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# --- running attnlab-train in tests ----------------------------------------------------

# Overrides that make any config run in seconds: a few steps, small splits.
FAST_TRAINER = [
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "callbacks.checkpoint_every_n_steps=3",
]
FAST_DATA = [  # the synthetic tasks' sizes
    "data.train_size=256",
    "data.val_size=32",
    "data.test_size=32",
    "data.batch_size=16",
    "data.eval_batch_size=16",
]
FAST = FAST_TRAINER + FAST_DATA


def compose_run(run_dir, overrides, fast=True, fast_data=True):
    """Compose conf/train.yaml as `attnlab-train` would, with run_dir as the output dir."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from attnlab.train import CONF_DIR

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        fast_overrides = (FAST_TRAINER + (FAST_DATA if fast_data else [])) if fast else []
        cfg = compose("train", overrides=[*fast_overrides, *overrides], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
        cfg.hydra.runtime.cwd = str(ROOT)
        cfg.hydra.job.num = 0
        cfg.hydra.job.override_dirname = ""
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def run_train(run_dir, *overrides, fast=True, fast_data=True, **kwargs):
    from attnlab.train import train

    return train(compose_run(run_dir, list(overrides), fast, fast_data), **kwargs)


def wandb_run_files(run_dir, timeout: float = 15):
    """The run's offline W&B files, each read only once it holds its exit record.

    wandb's service can still be writing a file after ``wandb.finish()`` returns, and a
    reader then misses the last rows (seen once in CI: the step-25 probe row of a 30-step
    run). A run killed outright never writes an exit record: after ``timeout`` seconds it is
    returned as it is.
    """
    from attnlab import wandb_records

    files = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + timeout
    for path in files:
        while time.monotonic() < deadline:
            try:
                if any(record.WhichOneof("record_type") == "exit" for record in wandb_records.records(path)):
                    break
            except ValueError:  # a chunk half-written at this moment
                pass
            time.sleep(0.2)
    return files


def cli(*args, cwd=ROOT, timeout=600, env=None):
    """Run the installed console script in a subprocess (``env``: variables to add); returns CompletedProcess."""
    script = Path(sys.executable).parent / args[0]
    return subprocess.run(
        [str(script), *args[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def wait_until(ready, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    """Poll ``ready()`` while ``proc`` runs; fail with its stderr if it ends first, or on time-out."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the command ended before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.2)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    wait_until(path.exists, proc, f"{path} to appear", timeout)


def processes_with(*variables: str) -> list[int]:
    """The pids of processes whose environment holds every one of ``variables`` ("NAME=value")."""
    wanted = [f"\0{variable}\0".encode() for variable in variables]
    found = []
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            environ = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if all(variable in environ for variable in wanted):
            found.append(pid)
    return found
