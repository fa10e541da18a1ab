"""hydra/launcher=local: a sweep's jobs side by side on one machine, each on its own device(s).

On CPU the devices are slots: the tests check the assignment the launcher makes (run.json's
``devices``, the time each job held them), not a GPU."""

import datetime
import signal
import subprocess
import sys
import textwrap
from itertools import combinations
from pathlib import Path

import pytest

from attnlab.config import ConfigError
from attnlab.launcher import DeviceLocks, check
from attnlab.report import load
from attnlab.rundir import read_run_file
from helpers import FAST_DATA, cli, wait_for

TRAIN = Path(sys.executable).parent / "attnlab-train"
QUICK = ["trainer.enable_progress_bar=false", "logger=csv", *FAST_DATA]


# --- the device locks ----------------------------------------------------------------------


def test_jobs_get_disjoint_devices_and_wait_when_none_are_free(tmp_path):
    first, second, third = (DeviceLocks(tmp_path, ["0", "1", "2", "3"], per_job=2) for _ in range(3))
    assert first.acquire("a") == ["0", "1"]
    assert second.acquire("b") == ["2", "3"]
    with pytest.raises(TimeoutError, match="no 2 free devices"):
        third.acquire("c", poll_s=0.05, timeout_s=0.3)
    first.release()
    assert third.acquire("c", timeout_s=1) == ["0", "1"]
    assert (tmp_path / "device-0.lock").read_text().startswith("c pid")  # who holds it


def test_a_killed_job_frees_its_devices(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from attnlab.launcher import DeviceLocks
            locks = DeviceLocks({str(tmp_path)!r}, ["0"], per_job=1)
            locks.acquire("doomed")
            print("held", flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(TimeoutError):
            DeviceLocks(tmp_path, ["0"], per_job=1).acquire("next", poll_s=0.05, timeout_s=0.3)
        holder.kill()  # SIGKILL: no cleanup code runs; the kernel drops the lock
        holder.wait(timeout=30)
        assert DeviceLocks(tmp_path, ["0"], per_job=1).acquire("next", timeout_s=5) == ["0"]
    finally:
        holder.kill()
        holder.wait(timeout=30)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"devices": [0, 1, 2, 3], "devices_per_job": 2, "jobs": None}, (["0", "1", "2", "3"], 2, 2)),
        ({"devices": [0, 1, 2], "devices_per_job": 1, "jobs": 2}, (["0", "1", "2"], 1, 2)),
        ({"devices": [0, 1], "devices_per_job": 1, "jobs": 5}, (["0", "1"], 1, 2)),  # never more than the devices
    ],
)
def test_how_many_jobs_run_at_once(options, expected):
    assert check(options) == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"devices": [0], "devices_per_job": 2, "jobs": None}, "devices_per_job=2 but .* has only 1"),
        ({"devices": [0, 1], "devices_per_job": -1, "jobs": None}, "devices_per_job=-1: must be a positive integer"),
        ({"devices": [0, 1], "devices_per_job": 1, "jobs": 0}, "jobs=0: must be a positive integer"),
        ({"devices": 3, "devices_per_job": 1, "jobs": None}, "devices=3: give a list of device ids"),
    ],
)
def test_bad_launcher_settings_are_named(options, message):
    with pytest.raises(ConfigError, match=message):
        check(options)


def test_auto_on_a_machine_without_gpus_says_how_to_give_slots(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match=r"no GPU to share out.*hydra.launcher.devices=\[0,1\]"):
        check({"devices": "auto", "devices_per_job": 1, "jobs": None})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert check({"devices": "auto", "devices_per_job": 1, "jobs": None}) == (["2", "5"], 1, 2)


def test_cli_refuses_bad_launcher_settings_before_writing_anything(tmp_path):
    result = cli("attnlab-train", "-m", "hydra/launcher=local", "hydra.launcher.devices=[0]", "trainer=ddp_cpu",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    assert "devices_per_job=2 but hydra.launcher.devices has only 1" in result.stderr
    assert not (tmp_path / "sweep").exists()


# --- sweeps through the launcher ----------------------------------------------------------------


def held(run_dir: Path) -> tuple[str, datetime.datetime, datetime.datetime]:
    record = read_run_file(run_dir)
    (device,) = record["devices"]
    return device, datetime.datetime.fromisoformat(record["started"]), datetime.datetime.fromisoformat(record["ended"])


def test_four_jobs_on_two_devices_run_two_at_a_time_never_sharing_one(tmp_path):
    sweep = tmp_path / "sweep"
    result = cli("attnlab-train", "-m", "hydra/launcher=local", "hydra.launcher.devices=[0,1]",
                 f"hydra.sweep.dir={sweep}", "seed=0,1,2,3", "trainer.max_steps=30", "trainer.val_check_interval=30",
                 "test=false", *QUICK, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {path.name: held(path) for path in sweep.iterdir() if path.name.isdigit()}
    assert sorted(jobs) == ["0", "1", "2", "3"]
    assert {device for device, *_ in jobs.values()} == {"0", "1"}
    overlapping = [(a, b) for a, b in combinations(jobs.values(), 2) if a[1] < b[2] and b[1] < a[2]]
    assert overlapping, f"no two jobs ran at the same time: {jobs}"
    assert all(a[0] != b[0] for a, b in overlapping), f"a device held by two jobs at once: {jobs}"
    assert {read_run_file(sweep / name)["status"] for name in jobs} == {"finished"}
    assert {run.status for run in load([sweep]).runs} == {"finished"}


@pytest.mark.slow  # ≈30 s; `make test-slow` (and CI) run it
def test_sigterm_stops_the_running_jobs_with_a_checkpoint_and_starts_no_more(tmp_path):
    sweep = tmp_path / "sweep"
    common = ["trainer.max_steps=400", "trainer.val_check_interval=100", "callbacks.checkpoint_every_n_steps=5",
              *QUICK]  # fmt: skip
    proc = subprocess.Popen([str(TRAIN), "-m", "hydra/launcher=local", "hydra.launcher.devices=[0,1]",
                             f"hydra.sweep.dir={sweep}", "seed=0,1,2", *common],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(sweep / "0" / "checkpoints" / "last.ckpt", proc)
        wait_for(sweep / "1" / "checkpoints" / "last.ckpt", proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "the sweep was stopped by SIGTERM: job(s) [0, 1] saved last.ckpt, 1 job(s) not started" in err
    for job in ("0", "1"):
        record = read_run_file(sweep / job)
        assert record["status"] == "interrupted" and 0 < record["step"] < 400
    assert not (sweep / "2").exists()
    resumed = cli("attnlab-train", f"resume={sweep / '0'}", "trainer.max_steps=20", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_run_file(sweep / "0")["status"] == "finished"
