"""A run dir's identity and state: unique names, ``run.json``, and what ``resume=`` may do.

* Every fresh run or sweep dir is created here, atomically (``mkdir`` that fails if the
  dir exists), as ``<time stamp>`` or, when that is taken, ``<time stamp>-1``, ``-2`` …:
  jobs started in the same second never share a dir.
* ``run.json`` in the run dir holds the W&B run id (random, made once) and the run's
  state: ``running``, ``finished``, ``interrupted``, ``diverged`` or ``failed``, with the
  step and the cause. The report reads it; ``resume=`` continues the same W&B run. A copy
  of a run dir resumed beside its original gets a W&B run of its own.
* ``resume=DIR`` continues in DIR (wherever it now lives) and nowhere else.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import itertools
import json
import os
import socket
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from attnlab.config import ConfigError, validate

RUN_FILE = "run.json"
# Overrides that may come with resume=: all others would silently not apply (the run keeps
# its own saved config), so they are refused.
ON_RESUME = {
    "trainer.max_steps": "extends (or shortens) the run",
    "trainer.enable_progress_bar": "display only",
}


def unique_dir(base: str) -> str:
    """Create ``base`` (or ``base-1``, ``base-2`` … if taken) and return it."""
    path = Path(base)
    path.parent.mkdir(parents=True, exist_ok=True)
    for number in itertools.count():
        candidate = path if number == 0 else path.with_name(f"{path.name}-{number}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return str(candidate)
    raise AssertionError("unreachable")


def run_dir_for(resume: str | None, fresh: str) -> str:
    """hydra.run.dir: the run being resumed, else a new unique dir under ``fresh``."""
    return str(resume) if resume else unique_dir(fresh)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write a temp file beside ``path``, flush it to disk, rename it over ``path``: a crash or
    a full disk leaves the previous file, never half of one (the temp file is removed)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as file:
            file.write(data.encode() if isinstance(data, str) else data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def read_run_file(run_dir: str | Path) -> dict:
    path = Path(run_dir) / RUN_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")


def new_wandb_id() -> str:
    return os.urandom(8).hex()


def start_run(run_dir: Path, resumed: bool) -> dict:
    """Write run.json for a (re)start and return it: a fresh id, the same one, or a copy's own."""
    here = str(run_dir.resolve())
    record = read_run_file(run_dir) if resumed else {}
    if resumed and not record:  # a run from before run.json: its id was derived from its path
        record = {"wandb_id": hashlib.sha1(here.encode()).hexdigest()[:16], "dir": here}
    if not record:
        record = {"wandb_id": new_wandb_id(), "dir": here, "created": now()}
    elif record.get("dir") != here:
        original = read_run_file(record["dir"]) if record.get("dir") else {}
        if original.get("wandb_id") == record["wandb_id"]:  # a copy, its original still there
            record = {**record, "wandb_id": new_wandb_id(), "copied_from": record["dir"]}
        record["dir"] = here  # else the dir was moved: it keeps its W&B run
    record.update(status="running", started=now(), step=record.get("step", 0), host=socket.gethostname())
    for key in ("ended", "reason", "devices"):
        record.pop(key, None)
    if os.environ.get("ATTNLAB_LAUNCHER_DEVICES"):  # the devices hydra/launcher=local gave this job
        record["devices"] = os.environ["ATTNLAB_LAUNCHER_DEVICES"].split(",")
    write_json(run_dir / RUN_FILE, record)
    return record


def end_run(run_dir: Path, status: str, step: int, reason: str = "") -> None:
    """Record how the run ended. Never raises: on a full disk the original error matters more."""
    record = read_run_file(run_dir)
    record.update(status=status, step=step, ended=now())
    if reason:
        record["reason"] = reason
    path = run_dir / RUN_FILE
    try:
        write_json(path, record)
    except OSError:  # a full disk: overwrite in place, in the blocks the file already has
        with contextlib.suppress(OSError), path.open("r+") as file:
            file.write(json.dumps(record, indent=2) + "\n")
            file.truncate()


# --- resume and the checks made before Hydra writes anything ------------------------------


def override_keys(overrides) -> list[str]:
    return [str(override).split("=", 1)[0].lstrip("+~") for override in overrides]


def check_resume(resume: str, task_overrides) -> Path:
    """The run dir ``resume`` names, if it can be resumed with these overrides; else ConfigError."""
    run_dir = Path(resume)
    if not run_dir.is_dir():
        raise ConfigError(
            f"resume={resume!r}: no such directory; give the dir of an earlier run "
            "(it holds config.yaml and checkpoints/last.ckpt)"
        )
    for needed in ("config.yaml", "checkpoints/last.ckpt"):
        if not (run_dir / needed).is_file():
            raise ConfigError(
                f"resume={resume!r}: {run_dir / needed} does not exist, so this is not a resumable run dir; "
                "point resume at the dir of an attnlab-train run that saved a checkpoint"
            )
    refused = [key for key in override_keys(task_overrides) if key != "resume" and key not in ON_RESUME]
    if refused:
        accepted = "; ".join(f"{key} ({why})" for key, why in ON_RESUME.items())
        raise ConfigError(
            f"resume= continues a run with its own saved config, so {', '.join(refused)} would not apply; "
            f"accepted with resume=: {accepted}. To change anything else, start a new run."
        )
    return run_dir


class Preflight(Callback):
    """Hydra callback: refuse a bad config, a bad resume= or a run/sweep dir that already
    holds a run, before Hydra creates or writes anything.

    Hydra turns an exception in a callback into a warning and carries on, so a refusal
    prints its message and exits (SystemExit passes through).
    """

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        refuse_on_error(self.check_run, config)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        refuse_on_error(self.check_sweep, config)

    @staticmethod
    def check_run(config: DictConfig) -> None:
        from attnlab.data import DATASETS  # datasets is heavy; attnlab-report reads run.json without it

        hydra_keys = override_keys(config.hydra.overrides.hydra)
        if config.resume:  # the run's own config is checked once loaded
            if "hydra.run.dir" in hydra_keys:
                raise ConfigError("resume=DIR runs in DIR; drop hydra.run.dir")
            check_resume(config.resume, config.hydra.overrides.task)
            return
        validate(config, DATASETS)
        if "hydra.run.dir" in hydra_keys and not os.environ.get("LOCAL_RANK"):
            run_dir = Path(str(config.hydra.run.dir))
            if (run_dir / "config.yaml").exists():
                raise ConfigError(
                    f"hydra.run.dir={run_dir} already holds a run (config.yaml); continue it with "
                    f"resume={run_dir}, or choose another dir"
                )

    @staticmethod
    def check_sweep(config: DictConfig) -> None:
        if config.resume:
            raise ConfigError("resume= continues one run: run it without -m (once per job dir to resume)")
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if launcher.endswith("LocalLauncher"):
            from attnlab.launcher import check

            check(config.hydra.launcher)
        devices = config.trainer.devices
        if launcher.endswith("SlurmLauncher") and not (isinstance(devices, int) and devices > 0):
            raise ConfigError(
                f"trainer.devices={devices!r}: on SLURM it is the number of tasks (and GPUs) per node, "
                "which SLURM must be asked for; set trainer.devices=<N>"
            )
        if "hydra.sweep.dir" in override_keys(config.hydra.overrides.hydra):
            sweep_dir = Path(str(config.hydra.sweep.dir))
            if (sweep_dir / "multirun.yaml").exists():
                raise ConfigError(
                    f"hydra.sweep.dir={sweep_dir} already holds a sweep (multirun.yaml); choose another dir "
                    "(or leave hydra.sweep.dir out: each sweep then gets a new one)"
                )


def refuse_on_error(check, config: DictConfig) -> None:
    try:
        check(config)
    except ConfigError as error:
        print(f"attnlab-train: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
