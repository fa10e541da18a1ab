"""attnlab-train on a real SLURM cluster: a throw-away single node (tests/slurm_cluster.py),
through the launcher preset users get (hydra/launcher=slurm_cpu, submitit).

Skipped, with the reason, where Debian's slurmctld/slurmd/slurm-client/munge are not
installed (``.ci/run`` installs them) or the tests do not run as root.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnlab import wandb_records
from attnlab.report import load
from attnlab.rundir import read_run_file
from helpers import FAST_DATA, processes_with, run_train, wait_for, wait_until, wandb_run_files
from slurm_cluster import SlurmCluster, missing_packages

pytestmark = pytest.mark.slurm

TRAIN = Path(sys.executable).parent / "attnlab-train"
ON_SLURM = ["hydra/launcher=slurm_cpu", "trainer.enable_progress_bar=false", *FAST_DATA]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = missing_packages()
    if missing:
        install = "apt-get install slurmctld slurmd slurm-client munge"
        pytest.skip(f"no SLURM here ({', '.join(missing)} not found): {install}")
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster runs as root (SlurmUser=root)")
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as started:
        yield started


def sweep(cluster, sweep_dir, *overrides, timeout=300) -> subprocess.Popen:
    return subprocess.Popen(
        [str(TRAIN), "-m", f"hydra.sweep.dir={sweep_dir}", *ON_SLURM, *overrides],
        env=cluster.env, cwd=sweep_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the sweep did not end within {timeout} s: {err[-3000:]}")
    return proc.returncode, err


def job_log(sweep_dir: Path) -> str:
    return "\n".join(path.read_text() for path in sorted((sweep_dir / ".submitit").rglob("*_log.*")))


def test_a_two_job_ddp_sweep_gives_two_run_dirs_each_with_one_wandb_run(cluster, tmp_path):
    # Two jobs, each DDP over 2 tasks (tasks_per_node follows trainer.devices): one run dir
    # and one W&B run per job, not per rank.
    sweep_dir = tmp_path / "sweep"
    code, err = finish(sweep(cluster, sweep_dir, "trainer=ddp_cpu", "attention.scale=none,dk", "trainer.max_steps=4",
                             "trainer.val_check_interval=2", "logger=wandb"))  # fmt: skip
    log = job_log(sweep_dir)
    assert code == 0, err[-3000:] + log[-3000:]
    assert sorted(path.name for path in sweep_dir.iterdir() if not path.name.startswith(".")) == [
        "0",
        "1",
        "multirun.yaml",
    ]
    assert "MEMBER: 2/2" in log or "WORLD_SIZE: 2" in log
    ids = set()
    for job in ("0", "1"):
        (run_file,) = wandb_run_files(sweep_dir / job)
        ids.add(wandb_records.run_info(run_file)["id"])
        assert read_run_file(sweep_dir / job)["status"] == "finished"
    assert len(ids) == 2
    report = load([sweep_dir])
    assert [run.status for run in report.runs] == ["finished", "finished"]
    assert sorted(run.config["attention.scale"] for run in report.runs) == ["dk", "none"]


REQUEUED = ["trainer.max_steps=200", "trainer.val_check_interval=50", "callbacks.checkpoint_every_n_steps=10",
            "model.dropout=0.1", "logger=wandb", "test=false"]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The same config run straight through, in this process: the weights a requeued job must end with."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    run_train(run_dir, *REQUEUED, "trainer.enable_progress_bar=false", *FAST_DATA, fast=False)
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)


@pytest.mark.slow  # ≈80 s: two requeues, each waiting out SLURM's restart delay
def test_usr1_and_a_real_preemption_requeue_and_the_job_ends_as_if_never_interrupted(cluster, tmp_path, uninterrupted):
    sweep_dir = tmp_path / "sweep"
    run_dir, last = sweep_dir / "0", sweep_dir / "0" / "checkpoints" / "last.ckpt"
    proc = sweep(cluster, sweep_dir, *REQUEUED)
    wait_for(last, proc)
    first_start = read_run_file(run_dir)["started"]
    (job,) = [job for job, state in cluster.jobs().items() if state == "RUNNING"]
    cluster.run(["scancel", "--signal=USR1", job])  # what --signal sends before a time limit

    # The requeued job starts again, resumes, and saves a checkpoint of its own ...
    def restarted():
        record = read_run_file(run_dir)
        started = record.get("started", first_start)
        return record.get("status") == "running" and started != first_start and last.stat().st_mtime > time.time() - 2

    wait_until(restarted, proc, "the requeued job to start again and checkpoint")
    # ... then a job in the higher-priority partition wants the whole node: SLURM preempts it.
    high = ["sbatch", "-p", "high", "-c", str(cluster.cpus), "-o", str(tmp_path / "high.out"), "--wrap", "sleep 2"]
    cluster.run(high)
    code, err = finish(proc)
    log = job_log(sweep_dir)
    assert code == 0, err[-3000:] + log[-3000:]
    assert log.count("Requeueing") == 2 and log.count("Restored all states") == 2

    record = read_run_file(run_dir)
    assert record["status"] == "finished" and record["step"] == 200
    resumed = torch.load(last, weights_only=False)
    assert resumed["global_step"] == uninterrupted["global_step"] == 200
    for name, tensor in uninterrupted["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name
    files = sorted(wandb_run_files(run_dir))  # one per start, in start order
    assert len(files) == 3 and len({wandb_records.run_info(path)["id"] for path in files}) == 1
    steps = [row["trainer/global_step"] for path in files for row in wandb_records.history(path)
             if "train/loss" in row]  # fmt: skip
    assert steps == sorted(steps) and steps[-1] >= 190  # the steps continue, never restart at 0


def test_a_crashing_job_fails_the_sweep_and_the_other_keeps_its_results(cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    started = time.monotonic()
    code, err = finish(sweep(cluster, sweep_dir, "optim.lr=1e-3,1e30", "optim.warmup_steps=1",
                             "trainer.gradient_clip_val=null", "trainer.max_steps=10", "trainer.log_every_n_steps=1",
                             "trainer.val_check_interval=10", "logger=csv"))  # fmt: skip
    assert code != 0 and time.monotonic() - started < 300
    assert "diverged" in err + job_log(sweep_dir)
    assert read_run_file(sweep_dir / "0")["status"] == "finished"
    assert read_run_file(sweep_dir / "1")["status"] == "diverged"


@pytest.mark.slow  # ≈40 s
def test_a_dead_rank_of_a_ddp_job_fails_the_sweep_within_seconds_naming_its_task(cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = sweep(cluster, sweep_dir, "trainer=ddp_cpu", "trainer.max_steps=100000", "trainer.val_check_interval=50",
                 "callbacks.checkpoint_every_n_steps=4", "logger=csv")  # fmt: skip
    wait_for(sweep_dir / "0" / "checkpoints" / "last.ckpt", proc)
    rank1 = processes_with(f"SLURM_CONF={cluster.env['SLURM_CONF']}", "SLURM_PROCID=1")
    assert rank1, "no process of task 1 found"
    for pid in rank1:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    code, err = finish(proc, timeout=120)
    print(f"the sweep ended {time.monotonic() - killed:.1f} s after task 1 was killed")
    assert code == 1 and time.monotonic() - killed < 60
    assert "(task: 1)" in err and "state: FAILED" in err  # submitit names the task and its error stream
    assert read_run_file(sweep_dir / "0")["status"] == "failed"  # rank 0 saw the peer go


def test_the_cluster_is_stopped_by_pid(tmp_path):
    """The harness itself: daemons up, then gone, with nothing left running."""
    if missing_packages() or os.geteuid() != 0:
        pytest.skip("no SLURM here")
    cluster = SlurmCluster(tmp_path / "c").start()
    pids = [proc.pid for proc in cluster._popen.values()]
    cluster.stop()
    assert all(not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
               for pid in pids)  # fmt: skip
    shutil.rmtree(tmp_path / "c", ignore_errors=True)


@pytest.mark.slow  # SLURM's time limits come in whole minutes: run by `make test-slow` (and CI)
def test_a_time_limit_hit_more_often_than_max_num_timeout_fails_the_job(cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # 2 minutes per start, the signal 70 s before its end; one requeue allowed, the second time-out fails.
    proc = sweep(cluster, sweep_dir, "trainer.max_steps=100000", "trainer.val_check_interval=1000",
                 "callbacks.checkpoint_every_n_steps=20", "logger=csv", "hydra.launcher.timeout_min=2",
                 "hydra.launcher.signal_delay_s=70", "hydra.launcher.max_num_timeout=1")  # fmt: skip
    code, err = finish(proc, timeout=600)
    log = job_log(sweep_dir)
    assert code != 0, err[-3000:]
    assert log.count("Requeueing") == 2 and "timed-out too many times" in log + err
    record = read_run_file(sweep_dir / "0")
    assert record["status"] == "interrupted" and record["step"] > 0  # saved, then reported failed


@pytest.mark.parametrize("launcher,devices,gpus", [("slurm", 4, 4), ("slurm_cpu", 2, None)])
def test_the_presets_ask_for_one_task_per_device_from_trainer_devices(launcher, devices, gpus):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from attnlab.train import CONF_DIR

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("train", [f"hydra/launcher={launcher}", f"trainer.devices={devices}", "trainer.num_nodes=2"],
                      return_hydra_config=True)  # fmt: skip
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert params["tasks_per_node"] == devices and params["gpus_per_node"] == gpus and params["nodes"] == 2
    assert params["signal_delay_s"] > 0 and params["max_num_timeout"] >= 1


def test_two_nodes_two_tasks_each_lightning_reads_the_ranks_slurm_gives(monkeypatch):
    """The environment of task 3 of a 2-node × 2-task job, as srun sets it: the Trainer that
    trainer=ddp_cpu trainer.num_nodes=2 builds takes its ranks from it, and attnlab agrees."""
    import lightning as L
    from lightning.fabric.utilities import rank_zero as fabric_rank_zero
    from lightning_utilities.core import rank_zero as utilities_rank_zero

    from attnlab.lifecycle import under_slurm
    from attnlab.train import is_rank_zero

    # The Trainer sets this process's rank (module-wide) and MASTER_* variables: undone after the test,
    # or every later run in this process would think it is rank 3 and log nothing.
    for module in (fabric_rank_zero, utilities_rank_zero):
        monkeypatch.setattr(module.rank_zero_only, "rank", module.rank_zero_only.rank)
    monkeypatch.setattr(os, "environ", os.environ.copy())

    slurm = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "2", "SLURM_PROCID": "3",
             "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NODELIST": "node[7-8]", "SLURM_JOB_ID": "42",
             "SLURM_JOB_NAME": "attnlab"}  # fmt: skip
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_ADDR", "")  # recorded, so that what Lightning sets is undone after the test
    monkeypatch.delenv("MASTER_ADDR")  # Lightning sets it from the node list
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)  # no srun warning here
    trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", logger=False)
    assert under_slurm()
    assert (trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size) == (3, 1, 1, 4)
    assert trainer.strategy.cluster_environment.main_address == "node7"
    assert not is_rank_zero()
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NODEID", "0")
    assert is_rank_zero()
