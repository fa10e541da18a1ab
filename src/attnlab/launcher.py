"""Run a sweep's jobs side by side on one machine, each on its own device(s).

    attnlab-train -m hydra/launcher=local seed=0,1,2,3,4,5,6,7          # all GPUs, one per job
    attnlab-train -m hydra/launcher=local hydra.launcher.devices=[4,5,6,7] trainer=ddp_gpu ...

Up to ``len(devices) // devices_per_job`` jobs run at once, each in a fresh process that
sees only its own GPUs (``CUDA_VISIBLE_DEVICES``, so inside the job they are cuda:0, …).
A job takes its devices by locking one file per device in ``lock_dir`` (``flock``): the
kernel releases a lock when the process holding it ends, however it ends, so a crashed or
killed job never keeps a device, and sweeps that share a ``lock_dir`` on one node never
hand out a device twice (a job waits for a free one).

SIGTERM or Ctrl-C stops the sweep as it stops a single run: no new job starts, each running
job saves ``last.ckpt`` at its current step, and the sweep exits 143 / 130.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import pickle
import re
import signal
import sys
import threading
import time
from multiprocessing import get_context
from multiprocessing.connection import wait
from pathlib import Path

from omegaconf import DictConfig

from attnlab.config import ConfigError

log = logging.getLogger(__name__)


# --- devices ---------------------------------------------------------------------------


def visible_devices(devices) -> list[str]:
    """The device ids to share out: the configured list, or every GPU this process may use."""
    if devices != "auto":
        if not devices or isinstance(devices, (str, int)):
            raise ConfigError(f"hydra.launcher.devices={devices!r}: give a list of device ids, e.g. [0,1], or auto")
        return [str(device) for device in devices]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [device.strip() for device in visible.split(",") if device.strip()]
    else:
        import torch

        ids = [str(index) for index in range(torch.cuda.device_count())]
    if not ids:
        raise ConfigError(
            "hydra.launcher.devices=auto: this machine has no GPU to share out; give the slots yourself, "
            "e.g. hydra.launcher.devices=[0,1] to run two CPU jobs at once"
        )
    return ids


def check(launcher: DictConfig | dict) -> tuple[list[str], int, int]:
    """(devices, devices per job, jobs at once) of a launcher config, or a ConfigError."""
    devices = visible_devices(launcher["devices"])
    per_job, jobs = launcher["devices_per_job"], launcher.get("jobs")
    if not isinstance(per_job, int) or isinstance(per_job, bool) or per_job < 1:
        raise ConfigError(
            f"hydra.launcher.devices_per_job={per_job!r}: must be a positive integer "
            "(it follows trainer.devices; set trainer.devices=<N>)"
        )
    if per_job > len(devices):
        raise ConfigError(
            f"hydra.launcher.devices_per_job={per_job} but hydra.launcher.devices has only {len(devices)} "
            f"({','.join(devices)}); give more devices or fewer per job"
        )
    slots = len(devices) // per_job
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise ConfigError(f"hydra.launcher.jobs={jobs!r}: must be a positive integer, or null for {slots}")
    return devices, per_job, min(jobs or slots, slots)


class DeviceLocks:
    """Hold ``per_job`` of ``devices`` through one lock file each in ``lock_dir``."""

    def __init__(self, lock_dir: Path, devices: list[str], per_job: int):
        self.lock_dir, self.devices, self.per_job = Path(lock_dir), devices, per_job
        self.files: dict[str, object] = {}

    def path(self, device: str) -> Path:
        return self.lock_dir / f"device-{re.sub(r'[^A-Za-z0-9_.-]', '_', device)}.lock"

    def try_acquire(self, holder: str) -> list[str] | None:
        """Lock ``per_job`` free devices, or none (and return None) if fewer are free."""
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        for device in self.devices:
            file = open(self.path(device), "a+")  # noqa: SIM115 (held open: the lock lives with it)
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.close()
                continue
            file.truncate(0)
            file.write(f"{holder} pid {os.getpid()}\n")  # who holds it, for a human looking
            file.flush()
            self.files[device] = file
            if len(self.files) == self.per_job:
                return list(self.files)
        self.release()
        return None

    def acquire(self, holder: str, poll_s: float = 0.5, timeout_s: float | None = None) -> list[str]:
        """Wait until ``per_job`` devices are free and lock them."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        waiting = False
        while (held := self.try_acquire(holder)) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no {self.per_job} free devices of {self.devices} in {self.lock_dir}")
            if not waiting:
                log.info(f"{holder}: waiting for {self.per_job} free device(s) of {self.devices} ({self.lock_dir})")
                waiting = True
            time.sleep(poll_s)
        return held

    def release(self) -> None:
        for file in self.files.values():
            file.close()  # closing the file releases its lock
        self.files = {}


# --- the launcher ----------------------------------------------------------------------


def launch(launcher, job_overrides, initial_job_idx: int) -> list:
    """Run the jobs, at most ``jobs`` at a time, each in its own process on its own devices."""
    import cloudpickle
    from hydra.core.singleton import Singleton
    from hydra.core.utils import configure_log, filter_overrides, setup_globals

    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    devices, per_job, at_once = check(launcher.options)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lock_dir = Path(launcher.options.get("lock_dir") or sweep_dir / ".devices")
    log.info(f"Running {len(job_overrides)} jobs, {at_once} at once, {per_job} of devices {devices} each "
             f"(locks in {lock_dir}); sweep output dir: {sweep_dir}")  # fmt: skip
    for idx, overrides in enumerate(job_overrides):
        log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")

    # cloudpickle: Hydra's task function is the undecorated main, which plain pickle cannot name.
    # Passed in a file: through the process's own pipe it would wait for the child's imports.
    shared = sweep_dir / f".launch-{os.getpid()}.pkl"
    state = (launcher.hydra_context, config, launcher.task_function, Singleton.get_state())
    shared.write_bytes(cloudpickle.dumps(state))
    threads = max(1, (os.cpu_count() or 1) // at_once)
    context = get_context("spawn")  # a fresh interpreter per job: CUDA is set up after the devices are chosen
    pending = collections.deque(enumerate(job_overrides))
    results: list = [None] * len(job_overrides)
    stopped: dict[int, int] = {}  # job number → exit code, for jobs a signal stopped
    with Stop() as stop, contextlib.ExitStack() as cleanup:
        cleanup.callback(shared.unlink, missing_ok=True)
        while stop.running or (pending and not stop.signum):
            while pending and len(stop.running) < at_once and not stop.signum:
                idx, overrides = pending.popleft()
                job = Job(idx, initial_job_idx + idx, context)
                job.start(shared, list(overrides), lock_dir, devices, per_job, threads)
                stop.running.append(job)
            waits = {job.process.sentinel: job for job in stop.running} | {job.results: job for job in stop.running}
            for ready in wait(list(waits), timeout=1.0):
                job = waits[ready]
                job.receive()
                if ready == job.process.sentinel:
                    job.process.join()
                    job.receive()
                    stop.running.remove(job)
                    results[job.idx], code = job.outcome(sweep_dir)
                    if code is not None:
                        stopped[job.number] = code
    if stop.signum or stopped:
        signum = stop.signum or next(iter(stopped.values())) - 128
        not_started = f", {len(pending)} job(s) not started" if pending else ""
        print(f"attnlab: the sweep was stopped by {signal.Signals(signum).name}: job(s) {sorted(stopped)} saved "
              f"last.ckpt{not_started}. Continue a job with: attnlab-train resume=<its dir>",
              file=sys.stderr, flush=True)  # fmt: skip
        raise SystemExit(128 + signum)
    return results


class Stop:
    """While jobs run: SIGTERM / SIGINT stop starting new ones and reach every running job once
    (the jobs have process groups of their own, so Ctrl-C in a terminal is not delivered twice)."""

    def __init__(self):
        self.signum: int | None = None
        self.running: list[Job] = []
        self.previous: dict = {}

    def __enter__(self) -> Stop:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.previous[signum] = signal.signal(signum, self.handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def handle(self, signum: int, frame) -> None:
        self.signum = self.signum or signum  # a second signal is passed on too: the jobs stop at once
        for job in self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(job.process.pid, signum)


class Job:
    """One sweep job in a process of its own; its JobReturn (or how it stopped) comes back by pipe."""

    def __init__(self, idx: int, number: int, context):
        self.idx, self.number = idx, number
        self.results, self.sender = context.Pipe(duplex=False)
        self.context = context  # spawn: a fresh interpreter
        self.message: tuple | None = None
        self.process = None

    def start(self, shared: Path, overrides, lock_dir, devices, per_job, threads) -> None:
        args = (self.sender, str(shared), self.number, overrides, str(lock_dir), devices, per_job, threads, os.getpid())
        self.process = self.context.Process(target=run_job_on_devices, args=args, name=f"job{self.number}")
        self.process.start()
        self.sender.close()

    def receive(self) -> None:
        try:
            while self.message is None and self.results.poll():
                self.message = self.results.recv()
        except (EOFError, OSError):
            pass

    def outcome(self, sweep_dir: Path):
        """(JobReturn, None) for a job that ran to its end or failed; (failed JobReturn, exit code) if stopped."""
        from hydra.core.utils import JobReturn, JobStatus

        if self.message and self.message[0] == "return":
            return self.message[1], None
        code = self.message[1] if self.message else self.process.exitcode
        code = 128 - code if isinstance(code, int) and code < 0 else code  # killed by a signal: -15 → 143
        error = RuntimeError(f"job #{self.number} ended with exit code {code}; see its log under {sweep_dir}")
        failed = JobReturn(status=JobStatus.FAILED, _return_value=error)
        return failed, (code if code in (128 + signal.SIGTERM, 128 + signal.SIGINT) else None)


def run_job_on_devices(sender, shared, number, overrides, lock_dir, devices, per_job, threads, parent) -> None:
    """In the job's process: lock its devices, show it only those, run it, send back its JobReturn."""
    os.setpgrp()  # Ctrl-C in the terminal reaches the launcher alone, which passes it on once
    threading.Thread(target=stop_when_orphaned, args=(parent,), daemon=True).start()
    locks = DeviceLocks(Path(lock_dir), devices, per_job)
    message = ("exit", 1)  # unless the job returns, or a signal stops it
    try:
        held = locks.acquire(f"job {number}")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(held)
        os.environ["ATTNLAB_LAUNCHER_DEVICES"] = ",".join(held)  # recorded in the run's run.json
        if "OMP_NUM_THREADS" not in os.environ:
            import torch

            torch.set_num_threads(threads)  # jobs side by side share the CPU cores
        from hydra_plugins.hydra_joblib_launcher._core import execute_job

        hydra_context, config, task_function, singleton_state = pickle.loads(Path(shared).read_bytes())
        message = ("return", travelling(execute_job(number, overrides, hydra_context, config, task_function,
                                                    singleton_state)))  # fmt: skip
    except SystemExit as exit_:  # a signal stopped the run after it saved (attnlab's Interrupted)
        message = ("exit", exit_.code if isinstance(exit_.code, int) else 1)
    except KeyboardInterrupt:  # a second signal: stopped at once
        message = ("exit", 128 + signal.SIGINT)
    finally:
        locks.release()
        with contextlib.suppress(OSError):  # the launcher may be gone
            sender.send(message)


def travelling(result):
    """The JobReturn without Hydra's config objects (their schema classes do not pickle by name)."""
    from hydra.core.utils import JobReturn
    from omegaconf import OmegaConf

    value = result._return_value
    try:
        pickle.dumps(value)
    except Exception:  # e.g. an exception that cannot travel: send its message
        value = RuntimeError(str(value))
    cfg = OmegaConf.create(OmegaConf.to_container(result.cfg)) if result.cfg is not None else None
    return JobReturn(overrides=result.overrides, cfg=cfg, working_dir=result.working_dir,
                     task_name=result.task_name, status=result.status, _return_value=value)  # fmt: skip


def stop_when_orphaned(parent: int) -> None:
    """The launcher is gone (e.g. killed): stop this job as SIGTERM would, saving last.ckpt."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
