"""Runs you can trust: unique dirs, resume in place, signals that save, atomic checkpoints,
a validation at every end, and the report's states."""

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from attnlab import wandb_records
from attnlab.config import ConfigError
from attnlab.lifecycle import CheckpointWriteError, Interrupted
from attnlab.report import load
from attnlab.rundir import read_run_file, unique_dir
from attnlab.runs import read_metrics, series
from helpers import FAST_DATA, cli, processes_with, run_train, wait_for, wandb_run_files

TRAIN = Path(sys.executable).parent / "attnlab-train"
QUIET = ["trainer.enable_progress_bar=false"]
TINY = [*FAST_DATA, *QUIET, "trainer.log_every_n_steps=1"]


def checksums(directory) -> dict:
    """Every file under a dir (hidden ones too) → sha256 of its bytes; a symlink → its target
    (W&B links logs/debug-core.log to its service's shared log, which others write)."""
    return {
        str(path.relative_to(directory)): os.readlink(path)
        if path.is_symlink()
        else hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(Path(directory).rglob("*"))
        if path.is_file() or path.is_symlink()
    }


def last_checkpoint(run_dir) -> dict:
    return torch.load(Path(run_dir) / "checkpoints" / "last.ckpt", weights_only=False)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"]
    for name, tensor in b["state_dict"].items():
        assert torch.equal(a["state_dict"][name], tensor), name


def start(*args, cwd) -> subprocess.Popen:
    return subprocess.Popen([str(TRAIN), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --- unique, race-free run identity ------------------------------------------------------


def test_unique_dir_never_hands_out_the_same_dir_twice(tmp_path):
    base = tmp_path / "outputs" / "2026-12-01_09-00-00"
    made = [unique_dir(str(base)) for _ in range(3)]
    assert [Path(path).name for path in made] == [base.name, f"{base.name}-1", f"{base.name}-2"]
    assert all(Path(path).is_dir() for path in made)


def test_two_runs_and_two_sweeps_started_in_the_same_second_get_their_own_dirs_and_wandb_ids(tmp_path):
    # The same time stamp for all four, as when they start in the same second.
    run_base = "hydra.run.dir=${attnlab_run_dir:null,outputs/clash/2026-12-01_09-00-00}"
    sweep_base = "hydra.sweep.dir=${attnlab_unique_dir:multirun/clash/2026-12-01_09-00-00}"
    common = ["name=clash", "trainer.max_steps=2", "trainer.val_check_interval=2", "test=false", *TINY]
    procs = [start(run_base, *common, cwd=tmp_path) for _ in range(2)]
    procs += [start("-m", sweep_base, "seed=0", *common, cwd=tmp_path) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]

    runs = sorted((tmp_path / "outputs" / "clash").iterdir())
    sweeps = sorted((tmp_path / "multirun" / "clash").iterdir())
    assert [path.name for path in runs] == ["2026-12-01_09-00-00", "2026-12-01_09-00-00-1"]
    assert [path.name for path in sweeps] == ["2026-12-01_09-00-00", "2026-12-01_09-00-00-1"]
    run_dirs = runs + [sweep / "0" for sweep in sweeps]
    ids = set()
    for run_dir in run_dirs:
        (run_file,) = wandb_run_files(run_dir)  # one W&B run per dir: nothing written twice
        ids.add(wandb_records.run_info(run_file)["id"])
        assert read_run_file(run_dir)["wandb_id"] == wandb_records.run_info(run_file)["id"]
        assert read_run_file(run_dir)["status"] == "finished"
        assert len(list((run_dir / "csv").iterdir())) == 1
    assert len(ids) == len(run_dirs) == 4


def test_a_copied_run_resumes_in_the_copy_with_its_own_wandb_run_and_the_original_untouched(tmp_path):
    original, copy = tmp_path / "original", tmp_path / "copy"
    run_train(original, "logger=wandb", "trainer.max_steps=6", "trainer.val_check_interval=3", fast=False)
    shutil.copytree(original, copy)
    before = checksums(original)

    run_train(tmp_path / "ignored", f"resume={copy}", "trainer.max_steps=9", fast=False)

    assert checksums(original) == before
    assert not (tmp_path / "ignored").exists()
    assert last_checkpoint(copy)["global_step"] == 9 and last_checkpoint(original)["global_step"] == 6
    assert read_run_file(copy)["copied_from"] == str(original.resolve())
    assert read_run_file(copy)["wandb_id"] != read_run_file(original)["wandb_id"]
    resumed = max(wandb_run_files(copy), key=lambda path: path.stat().st_mtime)
    assert wandb_records.run_info(resumed)["id"] == read_run_file(copy)["wandb_id"]
    assert (copy / "checkpoints" / "best.ckpt").exists() and (original / "checkpoints" / "best.ckpt").exists()


def test_a_moved_run_keeps_its_wandb_run(tmp_path):
    first, moved = tmp_path / "first", tmp_path / "moved"
    run_train(first, "logger=csv", "trainer.max_steps=3", "trainer.val_check_interval=3", fast=False)
    wandb_id = read_run_file(first)["wandb_id"]
    first.rename(moved)
    run_train(tmp_path / "ignored", f"resume={moved}", "trainer.max_steps=4", fast=False)
    assert read_run_file(moved)["wandb_id"] == wandb_id and read_run_file(moved)["dir"] == str(moved.resolve())
    assert last_checkpoint(moved)["global_step"] == 4


def test_cli_resume_of_a_missing_dir_creates_nothing(tmp_path):
    result = cli("attnlab-train", f"resume={tmp_path / 'nowhere'}", cwd=tmp_path)
    assert result.returncode != 0
    assert "resume=" in result.stderr and "no such directory" in result.stderr
    assert sorted(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_train(run_dir, "logger=csv", "trainer.max_steps=4", "trainer.val_check_interval=2", fast=False)
    return run_dir


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["model.n_heads=8"], r"model.n_heads would not apply.*trainer.max_steps"),
        (["-m"], r"resume= continues one run"),
        (["hydra.run.dir=elsewhere"], r"drop hydra.run.dir"),
    ],
)
def test_cli_resume_refuses_overrides_it_would_ignore_and_changes_nothing(finished_run, tmp_path, overrides, expected):
    import re

    before = checksums(finished_run)
    result = cli("attnlab-train", f"resume={finished_run}", *overrides, cwd=tmp_path)
    assert result.returncode != 0
    assert re.search(expected, result.stderr), result.stderr[-2000:]
    assert checksums(finished_run) == before
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("override", ["data=reverse", "attention.scale=none", "+model.extra=1"])
def test_resume_refuses_overrides_in_process_too(finished_run, tmp_path, override):
    before = checksums(finished_run)
    with pytest.raises(ConfigError, match="would not apply"):
        run_train(tmp_path / "ignored", f"resume={finished_run}", override, fast=False)
    assert checksums(finished_run) == before


def test_a_fresh_run_refuses_a_dir_that_already_holds_a_run(finished_run):
    before = checksums(finished_run)
    result = cli("attnlab-train", f"hydra.run.dir={finished_run}", "trainer.max_steps=2")
    assert result.returncode != 0 and "already holds a run" in result.stderr and "resume=" in result.stderr
    assert checksums(finished_run) == before


# --- every run ends with a validation ------------------------------------------------------


@pytest.mark.parametrize("max_steps", [5, 10])
def test_every_run_ends_with_a_validation_and_a_best_checkpoint(tmp_path, max_steps):
    # val_check_interval=200 (the default) never comes: the last step validates anyway.
    run_train(tmp_path, "logger=csv", f"trainer.max_steps={max_steps}", "test=false", fast=False, fast_data=True)
    steps, losses = series(read_metrics(tmp_path), "val/loss")
    assert steps == [max_steps - 1] and len(losses) == 1  # logged at the last step (global step − 1)
    assert (tmp_path / "checkpoints" / "best.ckpt").exists()
    assert last_checkpoint(tmp_path)["global_step"] == max_steps
    run = load([tmp_path]).runs[0]
    assert run.status == "finished", run.problem


def test_a_last_step_that_validates_anyway_validates_once(tmp_path):
    run_train(tmp_path, "logger=csv", "trainer.max_steps=6", "trainer.val_check_interval=3", "test=false")
    assert series(read_metrics(tmp_path), "val/loss")[0] == [2, 5]


def test_the_report_names_a_diverged_run_with_its_step(tmp_path):
    with pytest.raises(FloatingPointError):
        run_train(tmp_path, "optim.lr=1e30", "optim.warmup_steps=1", "trainer.gradient_clip_val=null",
                  "trainer.max_steps=30", "logger=csv")  # fmt: skip
    run = load([tmp_path]).runs[0]
    assert run.status == "diverged"
    assert run.problem.startswith("diverged at step ") and "FloatingPointError" in run.problem
    assert read_run_file(tmp_path)["status"] == "diverged"


def test_the_report_skips_another_tools_config_yaml(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.yaml").write_text("learning_rate: 0.1\nlayers: [1, 2]\n")
    result = cli("attnlab-report", str(tmp_path / "other"))
    assert result.returncode == 2 and "no config.yaml of an attnlab-train run" in result.stderr


# --- signals: save, say how to resume, exit non-zero ----------------------------------------


class SendSignal(Callback):
    """Sends a real signal to this process at a given point of training."""

    def __init__(self, signum, step, during_validation=False):
        self.signum, self.step, self.during_validation, self.sent = signum, step, during_validation, False

    def send(self, trainer):
        if not self.sent and trainer.global_step == self.step:
            self.sent = True
            os.kill(os.getpid(), self.signum)

    def on_train_batch_start(self, trainer, *args):
        if not self.during_validation:
            self.send(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.during_validation and batch_idx == 0 and trainer.state.fn == "fit":
            self.send(trainer)


SIGNAL_RUN = ["trainer.max_steps=12", "trainer.val_check_interval=6", "callbacks.checkpoint_every_n_steps=100",
              "model.dropout=0.1", "logger=csv", "test=false", "data.val_size=64",
              "data.eval_batch_size=16"]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    run_train(run_dir, *SIGNAL_RUN)
    return last_checkpoint(run_dir)


@pytest.mark.parametrize(
    "signum,during_validation,stopped_at",
    [(signal.SIGTERM, False, 5), (signal.SIGINT, False, 5), (signal.SIGTERM, True, 6)],
    ids=["sigterm-in-a-step", "sigint-in-a-step", "sigterm-in-validation"],
)
def test_a_signal_saves_the_current_step_and_resume_ends_bit_identical(
    tmp_path, uninterrupted, signum, during_validation, stopped_at
):
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted) as stop:
        run_train(run_dir, *SIGNAL_RUN, extra_callbacks=(SendSignal(signum, 4 if not during_validation else 6,
                                                                     during_validation),))  # fmt: skip
    assert stop.value.code == 128 + signum
    assert f"resume={run_dir}" in stop.value.message
    assert last_checkpoint(run_dir)["global_step"] == stopped_at
    record = read_run_file(run_dir)
    assert record["status"] == "interrupted" and record["step"] == stopped_at
    if during_validation:  # the validation in progress finished first: its metrics are whole
        assert series(read_metrics(run_dir), "val/loss")[0] == [5]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored

    run_train(tmp_path / "ignored", f"resume={run_dir}", fast=False)
    assert_same_weights(last_checkpoint(run_dir), uninterrupted)
    assert read_run_file(run_dir)["status"] == "finished"


def test_sigterm_to_a_real_run_exits_143_and_resume_matches_an_uninterrupted_run(tmp_path):
    common = ["trainer.max_steps=60", "trainer.val_check_interval=20", "callbacks.checkpoint_every_n_steps=5",
              "model.dropout=0.1", "logger=wandb", *TINY]  # fmt: skip
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    proc = start(f"hydra.run.dir={stopped}", *common, cwd=tmp_path)
    wait_for(stopped / "checkpoints" / "last.ckpt", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    step = read_run_file(stopped)["step"]
    assert 5 <= step < 60 and last_checkpoint(stopped)["global_step"] == step
    assert f"Continue with: attnlab-train resume={stopped}" in err.strip().splitlines()[-1]

    assert cli("attnlab-train", f"resume={stopped}", cwd=tmp_path).returncode == 0
    run_train(straight, *common, fast=False)  # the same config, uninterrupted, in this process
    assert_same_weights(last_checkpoint(stopped), last_checkpoint(straight))
    ids = {wandb_records.run_info(path)["id"] for path in wandb_run_files(stopped)}
    assert len(ids) == 1  # the same W&B run, continued


def test_sigterm_to_a_sweep_stops_it_non_zero_and_keeps_finished_jobs(tmp_path):
    sweep = tmp_path / "sweep"
    common = ["trainer.max_steps=40", "trainer.val_check_interval=20", "callbacks.checkpoint_every_n_steps=5",
              "logger=csv", *TINY]  # fmt: skip
    proc = start("-m", f"hydra.sweep.dir={sweep}", "attention.scale=none,dk,learned", *common, cwd=tmp_path)
    wait_for(sweep / "1" / "checkpoints" / "last.ckpt", proc)
    first_job = checksums(sweep / "0")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert checksums(sweep / "0") == first_job and read_run_file(sweep / "0")["status"] == "finished"
    assert read_run_file(sweep / "1")["status"] == "interrupted"
    assert not (sweep / "2").exists()  # the rest of the sweep did not run
    states = {Path(run.name).name: run.status for run in load([sweep]).runs}
    assert states == {"0": "finished", "1": "unfinished", "2": "missing"}


# --- a full disk ---------------------------------------------------------------------------


class FillDisk(Callback):
    """After the first checkpoint, fill the run dir's filesystem to the last byte."""

    def __init__(self, after_step):
        self.after_step = after_step

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.after_step:
            filler = Path(trainer.default_root_dir).parent / "filler"
            with open(filler, "ab", buffering=0) as file:
                for block in (1 << 16, 1):  # big blocks, then the last bytes
                    with contextlib.suppress(OSError):
                        while file.write(b"\0" * block):
                            pass


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=60)


def test_a_full_disk_keeps_the_previous_checkpoint_and_names_the_path(small_disk):
    run_dir = small_disk / "run"
    with pytest.raises(CheckpointWriteError) as error:
        run_train(run_dir, "logger=csv", "trainer.max_steps=12", "callbacks.checkpoint_every_n_steps=3",
                  "trainer.val_check_interval=100", extra_callbacks=(FillDisk(after_step=4),), fast=False,
                  fast_data=True)  # fmt: skip
    message = str(error.value)
    assert str(run_dir / "checkpoints" / "last.ckpt") in message and "intact" in message
    assert last_checkpoint(run_dir)["global_step"] == 3  # the previous one still loads
    assert not list((run_dir / "checkpoints").glob(".*tmp*"))  # no half-written temp file left
    record = read_run_file(run_dir)  # its end is recorded even on the full disk
    assert record["status"] == "failed" and "CheckpointWriteError" in record["reason"]


# --- bad input: clear errors, before anything is written -------------------------------------


BAD_CONFIGS = [
    ("attention.scale=inf", r"attention.scale=inf is not valid.*finite"),
    ("model.n_layers=1.5", r"model.n_layers"),
    ("model.d_k=16.5", r"model.d_k"),
    ("seed=abc", r"seed"),
    ("attention.dropout=1.5", r"attention.dropout=1.5 is not valid.*\[0, 1\)"),
    ("+model.nheads=4", r"model.nheads is not a setting of model.*did you mean model.n_heads"),
    ("model.n_heads=0", r"model.n_heads=0 is not valid.*positive integer"),
    ("model.dropout=-0.1", r"model.dropout=-0.1 is not valid"),
    ("trainer.max_steps=-5", r"trainer.max_steps=-5 is not valid"),
    ("optim.lr=nan", r"optim.lr=nan is not valid"),
    ("optim.label_smoothing=1", r"optim.label_smoothing=1.0 is not valid"),
    ("optim.betas=[0.9,1.5]", r"optim.betas=\[0.9, 1.5\] is not valid"),
    ("data.min_len=20", r"data.min_len=20 > data.max_len=12"),
    ("callbacks.probes.every_n_steps=0", r"callbacks.probes.every_n_steps=0 is not valid"),
    ("trainer=gpu", r"trainer.accelerator='gpu' but torch sees no CUDA GPU.*trainer=cpu"),
    ("model.compile_mode=fast", r"model.compile_mode='fast' is not valid; accepted values: default, reduce-overhead"),
    ("model.compile=maybe", r"model.compile"),
    ("data.max_tokens=0", r"data.max_tokens=0 is not valid"),
    ("callbacks.average.last_k=0", r"callbacks.average.last_k=0 is not valid"),
]
CLI_CASES = ("model.d_k=16.5", "+model.nheads=4", "trainer=gpu")


@pytest.mark.parametrize("override,expected", BAD_CONFIGS, ids=[case[0] for case in BAD_CONFIGS])
def test_bad_config_names_the_key_and_what_is_accepted(tmp_path, override, expected):
    import re

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if override == "trainer=gpu" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises((ConfigError, HydraException, OmegaConfBaseException)) as error:
        run_train(tmp_path / "run", override)
    assert re.search(expected, str(error.value)), str(error.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override,expected", [case for case in BAD_CONFIGS if case[0] in CLI_CASES], ids=CLI_CASES)
def test_cli_bad_config_is_one_clear_error_before_anything_is_written(tmp_path, override, expected):
    import re

    if override == "trainer=gpu" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = cli("attnlab-train", override, cwd=tmp_path)
    assert result.returncode == 1
    assert re.search(expected, result.stderr), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert sorted(tmp_path.iterdir()) == []  # no run dir, no outputs/


# --- DDP: resume on every rank, and a rank that dies ----------------------------------------

DDP = ["trainer=ddp_cpu", "trainer.val_check_interval=4", "callbacks.checkpoint_every_n_steps=4", "model.dropout=0.1",
       "logger=csv", "test=false", *TINY]  # fmt: skip


@pytest.mark.slow  # ≈65 s: three 2-process DDP runs
def test_ddp_resume_restores_every_rank_and_ends_as_an_uninterrupted_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for run_dir, steps in ((straight, 8), (resumed, 4)):
        result = cli("attnlab-train", f"hydra.run.dir={run_dir}", f"trainer.max_steps={steps}", *DDP, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    result = cli("attnlab-train", f"resume={resumed}", "trainer.max_steps=8", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_weights(last_checkpoint(resumed), last_checkpoint(straight))
    assert read_run_file(resumed)["status"] == "finished"


def test_a_dead_ddp_rank_fails_the_run_within_seconds_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(f"hydra.run.dir={run_dir}", "trainer.max_steps=100000", *DDP, cwd=tmp_path)
    wait_for(run_dir / "checkpoints" / "last.ckpt", proc)
    (rank1,) = processes_with(f"ATTNLAB_DDP_PARENT={proc.pid}")
    os.kill(rank1, signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=120)
    print(f"the run ended {time.monotonic() - killed:.1f} s after rank 1 was killed")
    assert proc.returncode == 1 and time.monotonic() - killed < 60
    assert f"DDP rank 1 exited with code -9; see its log {run_dir / 'rank1.log'}" in err
    assert read_run_file(run_dir)["status"] == "failed"
