"""The config tree as a user drives it: every experiment's sweep, debug=, callbacks and
loggers added by _target_, paths and the git-ignored local/ override."""

import csv
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from attnlab.config import ConfigError, validate
from attnlab.data import DATASETS
from attnlab.rundir import read_run_file
from attnlab.runs import read_metrics, series
from attnlab.task import build_model
from attnlab.train import CONF_DIR
from helpers import FAST, ROOT, cli, run_train

CONF = ROOT / "conf"

# What each experiment sweeps: (the axes, the number of jobs). Changing an experiment's sweep
# means changing this table: it is what the experiment's README promises.
SWEEPS = {
    "additive_vs_dot": ({"attention", "attention.scale", "model.d_k"}, 8),
    "coord_check": ({"attention.scale", "model.d_k", "seed"}, 40),
    "dk_ablation": ({"model.d_k"}, 3),
    "dk_init": ({"attention.scale", "model.d_k"}, 24),
    "heads_ablation": ({"model.n_heads"}, 5),
    "length_generalisation": ({"attention.scale", "seed"}, 12),
    "lr_sensitivity": ({"attention.scale", "optim.lr", "seed"}, 56),
    "scale_ablation": ({"attention.scale"}, 4),
    "scale_quick": ({"attention.scale"}, 4),
    "table3_cpu": ({"table3", "seed"}, 20),
    "table3_cpu_long": ({"table3", "seed"}, 4),
    "vaswani_base": (set(), 1),  # one run, on a GPU cluster
}


def compose_config(overrides: list[str]):
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=True)


def sweep_jobs(experiment: str) -> list[list[str]]:
    params = compose_config([f"experiment={experiment}"]).hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{key}={value}" for key, value in params.items()])
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def test_every_experiment_has_a_sweep_in_the_table():
    assert sorted(SWEEPS) == sorted(path.stem for path in (CONF / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", sorted(SWEEPS))
def test_every_job_of_every_experiment_sweep_composes_validates_and_builds(experiment):
    axes, count = SWEEPS[experiment]
    jobs = sweep_jobs(experiment)
    assert len(jobs) == count
    assert {override.split("=")[0] for job in jobs for override in job} == axes
    built, covered = set(), set()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        for job in jobs:
            if len(jobs) > 24 and set(job) <= covered:  # big grids: every value of every axis, once (0.3 s a job)
                continue
            covered |= set(job)
            cfg = compose("train", overrides=[f"experiment={experiment}", *job], return_hydra_config=True)
            validate(cfg, DATASETS)  # e.g. an n_heads that does not divide d_model fails here
            shape = repr((dict(cfg.model), dict(cfg.attention)))
            if shape not in built:  # jobs that differ only in seed or LR build the same model
                built.add(shape)
                model = build_model(dict(cfg.model), dict(cfg.attention), vocab_size=32)
                assert sum(p.numel() for p in model.parameters()) > 0


# --- debug= -----------------------------------------------------------------------------------


@pytest.mark.slow  # ≈15 s: three trainings and a study
def test_optuna_tunes_the_lr_and_reports_the_best_trial(tmp_path):
    """hparams_search=lr_optuna: a real Optuna study (3 trials); its best is the best trial's."""
    result = cli("attnlab-train", "-m", "hparams_search=lr_optuna", f"hydra.sweep.dir={tmp_path}",
                 "hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.n_startup_trials=2", "logger=csv",
                 *FAST, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    best = OmegaConf.load(tmp_path / "optimization_results.yaml")
    trials = sorted(path for path in tmp_path.iterdir() if (path / "config.yaml").exists())
    assert len(trials) == 3
    lrs = [OmegaConf.load(path / "config.yaml").optim.lr for path in trials]
    assert len(set(lrs)) == 3 and all(1e-4 <= lr <= 1e-1 for lr in lrs)  # drawn log-uniformly, not the default
    scores = [min(series(read_metrics(path), "val/loss")[1]) for path in trials]
    assert best.best_value == pytest.approx(min(scores), rel=1e-5)
    assert best.best_params["optim.lr"] == pytest.approx(lrs[scores.index(min(scores))])


def test_debug_fdr_runs_one_step_of_everything_and_logs_nothing(tmp_path):
    run_dir = tmp_path / "run"
    result = cli("attnlab-train", "debug=fdr", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fast_dev_run" in result.stderr + result.stdout
    record = read_run_file(run_dir)
    assert record["status"] == "finished" and record["step"] == 1
    assert not (run_dir / "csv").exists() and not (run_dir / "wandb").exists()


@pytest.mark.slow  # ≈25 s: each step is an epoch of one batch
def test_debug_overfit_drives_the_loss_of_one_batch_down(tmp_path):
    run_train(tmp_path / "run", "debug=overfit", "trainer.max_steps=60", "trainer.val_check_interval=60",
              "trainer.enable_progress_bar=false", "logger=csv", fast=False)  # fmt: skip
    _, losses = series(read_metrics(tmp_path / "run"), "train/loss")
    assert len(losses) == 60
    assert losses[-1] < 0.5 * losses[0], losses[::10]


def test_debug_limit_and_profiler(tmp_path):
    run_train(tmp_path / "limit", "debug=limit", "trainer.enable_progress_bar=false", "logger=csv", fast=False)
    metrics = read_metrics(tmp_path / "limit")
    assert series(metrics, "val/loss")[0] == [9, 19]
    assert series(metrics, "test/loss")[1]
    run_train(tmp_path / "prof", "debug=profiler", "trainer.max_steps=5", "trainer.val_check_interval=5",
              "trainer.enable_progress_bar=false", fast=False)  # fmt: skip
    profile = (tmp_path / "prof" / "fit-profile.txt").read_text()
    assert "run_training_batch" in profile


# --- callbacks and loggers by _target_ ---------------------------------------------------------


def test_early_stopping_from_yaml_stops_at_the_first_validation_that_meets_it(tmp_path):
    run_dir = tmp_path / "run"
    run_train(run_dir, "+callbacks/extra=early_stopping", "+callbacks.extra.early_stopping.stopping_threshold=1000",
              "trainer.max_steps=12", "trainer.val_check_interval=4", "logger=csv")  # fmt: skip
    record = read_run_file(run_dir)
    assert record["status"] == "finished" and record["step"] == 4
    assert series(read_metrics(run_dir), "val/loss")[0] == [3]


def test_a_logger_added_by_target_gets_the_same_metrics(tmp_path):
    run_dir = tmp_path / "run"
    extra = (
        "+logger.extra.mirror={_target_:lightning.pytorch.loggers.CSVLogger,save_dir:" + str(run_dir) + ",name:mirror}"
    )
    run_train(run_dir, extra, "logger=csv", "test=false")
    (mirror,) = (run_dir / "mirror").glob("version_*/metrics.csv")
    with mirror.open() as file:
        header = next(csv.reader(file))
    assert {"train/loss", "val/loss", "perf/tokens_per_s"} <= set(header)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+callbacks.extra.bad={_target_:lightning.pytorch.callbacks.NoSuch}",
         r"callbacks.extra.bad._target_='lightning.pytorch.callbacks.NoSuch' cannot be imported .*has no attribute"),
        ("+callbacks.extra.bad=3", r"callbacks.extra.bad=3: give \{_target_: <a class"),
        ("+logger.extra.bad={_target_:nowhere.Logger}", r"logger.extra.bad._target_='nowhere.Logger' cannot be"),
    ],
)  # fmt: skip
def test_a_bad_target_is_named_before_anything_runs(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        run_train(tmp_path / "run", override)
    assert not (tmp_path / "run").exists()


# --- paths and local/ ----------------------------------------------------------------------------


def test_paths_decide_where_runs_and_sweeps_go(tmp_path):
    cfg = compose_config([f"paths.outputs={tmp_path / 'runs'}", f"paths.multirun={tmp_path / 'sweeps'}", "name=placed"])
    run_dir, sweep_dir = Path(cfg.hydra.run.dir), Path(cfg.hydra.sweep.dir)  # resolving them creates them
    assert run_dir.parent == tmp_path / "runs" / "placed" and run_dir.is_dir()
    assert sweep_dir.parent == tmp_path / "sweeps" / "placed" and sweep_dir.is_dir()


def test_a_local_override_applies_to_every_run_and_is_git_ignored(tmp_path):
    local = CONF / "local" / "default.yaml"
    if local.exists():
        pytest.skip(f"{local} is yours; not touching it")
    assert "conf/local/" in (ROOT / ".gitignore").read_text().split()
    local.parent.mkdir(exist_ok=True)
    try:
        local.write_text("# @package _global_\ntrainer:\n  log_every_n_steps: 7\npaths:\n  outputs: /tmp/mine\n")
        cfg = compose_config([])
        assert cfg.trainer.log_every_n_steps == 7 and cfg.paths.outputs == "/tmp/mine"
        assert compose_config(["trainer.log_every_n_steps=3"]).trainer.log_every_n_steps == 3  # the CLI still wins
    finally:
        local.unlink()
        if not any(local.parent.iterdir()):
            local.parent.rmdir()
    assert compose_config([]).trainer.log_every_n_steps == 10
