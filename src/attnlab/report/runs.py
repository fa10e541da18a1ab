"""Finding runs on disk (or in W&B), working out what varies, and aggregating over seeds."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from attnlab.rundir import read_run_file
from attnlab.runs import MAPS_DIR, flatten, read_config, read_metrics, series

# Config keys that differ between runs without being part of the experiment.
NOT_COMPARED = ("run_dir", "paths.", "cache_dir", "resume", "logger.", "trainer.enable_progress_bar", "data.sword_dir")


class ReportError(ValueError):
    """A path with no runs, or runs that cannot be read; the message says which and why."""


@dataclass
class Run:
    name: str  # a path, or a W&B run id
    config: dict  # flattened: {"attention.scale": "none", ...}
    rows: list[dict] = field(default_factory=list)  # metric rows, each with "step"
    status: str = "finished"  # finished | unfinished | diverged | failed | missing
    problem: str = ""
    wall_s: float | None = None
    bleu: dict = field(default_factory=dict)  # bleu.json: {split: {score, signature, decoder, sentences}}

    def series(self, key: str) -> tuple[list[float], list[float]]:
        return series(self.rows, key)

    def last(self, key: str) -> float | None:
        values = self.series(key)[1]
        return values[-1] if values else None

    def at_step(self, key: str, step: float) -> float | None:
        steps, values = self.series(key)
        return values[steps.index(step)] if step in steps else None

    @property
    def steps_trained(self) -> int:
        """Optimizer steps done: rows are logged at (global step − 1); test rows excluded."""
        steps = [row["step"] for row in self.rows if not any(key.startswith("test/") for key in row)]
        return int(max(steps)) + 1 if steps else 0

    def metric_names(self) -> set[str]:
        return set().union(*self.rows) if self.rows else set()


def d_k_of(config: dict) -> int:
    """The key size a run used: model.d_k, or d_model / n_heads when derived."""
    return config.get("model.d_k") or config["model.d_model"] // config["model.n_heads"]


def load_run(run_dir: Path) -> Run:
    """A run and its state: from run.json (how the run ended), else from what it logged."""
    config = flatten(read_config(run_dir))
    rows = read_metrics(run_dir)
    run = Run(name=str(run_dir), config=config, rows=rows)
    if (run_dir / "bleu.json").is_file():
        run.bleu = json.loads((run_dir / "bleu.json").read_text())
    record = read_run_file(run_dir)
    metrics_files = sorted((run_dir / "csv").glob("version_*/metrics.csv"))
    if record.get("started") and record.get("ended"):  # survives copying the run's files elsewhere
        times = [datetime.fromisoformat(record[key]) for key in ("started", "ended")]
        run.wall_s = (times[1] - times[0]).total_seconds()
    elif metrics_files:
        run.wall_s = max(path.stat().st_mtime for path in metrics_files) - (run_dir / "config.yaml").stat().st_mtime
    state, step, reason = record.get("status"), record.get("step", run.steps_trained), record.get("reason", "")
    max_steps = config.get("trainer.max_steps", 0)
    if state == "diverged":
        run.status, run.problem = "diverged", f"diverged at step {step}: {reason}"
    elif state == "failed":
        run.status, run.problem = "failed", f"failed at step {step}: {reason}"
    elif state in ("interrupted", "running"):
        how = "stopped by a signal" if state == "interrupted" else "no end recorded (still running, or killed)"
        run.status = "unfinished"
        run.problem = f"{how} at step {step} of {max_steps}; continue with `attnlab-train resume={run_dir}`"
    elif not rows:
        run.status, run.problem = "failed", "no metrics were written (csv/version_*/metrics.csv missing or empty)"
    elif not run.series("val/loss")[1]:
        run.status, run.problem = "failed", f"no val/loss logged (last step {run.steps_trained})"
    elif state is None and run.steps_trained < max_steps:  # a run from before run.json
        run.status, run.problem = "unfinished", f"stopped at step {run.steps_trained} of {max_steps}"
    return run


def expected_jobs(sweep_dir: Path) -> int | None:
    """How many jobs a Hydra multirun launched, from its multirun.yaml (Hydra's own parser)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    multirun = sweep_dir / "multirun.yaml"
    if not multirun.exists():
        return None
    hydra_cfg = OmegaConf.load(multirun).hydra
    params = hydra_cfg.sweeper.get("params") or {}
    # The sweeper's own arithmetic: sweeper.params, then the command line, which wins for a key.
    overrides = [f"{key}={value}" for key, value in params.items()] + list(hydra_cfg.overrides.task)
    (jobs,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)
    return len(jobs)


def is_attnlab_run(run_dir: Path) -> bool:
    """A config.yaml written by attnlab-train (not some other tool's)."""
    try:
        config = OmegaConf.load(run_dir / "config.yaml")
    except Exception:  # unreadable YAML: not ours to report on
        return False
    return isinstance(config, DictConfig) and all(key in config for key in ("model", "attention", "trainer"))


def run_dirs_under(path: Path) -> list[Path]:
    """Dirs holding an attnlab config.yaml; Hydra's own (.hydra/, .hydra-resume/) are not runs."""
    if (path / "config.yaml").exists():
        found = [path]
    else:
        found = (p.parent for p in path.rglob("config.yaml"))
        found = [d for d in found if not any(part.startswith(".") for part in d.relative_to(path).parts)]
    return sorted(d for d in found if is_attnlab_run(d))


def missing_jobs(sweep: Path, run_dirs: list[Path]) -> list[Run]:
    """The jobs a sweep's multirun.yaml launched that left no run dir behind."""
    count = expected_jobs(sweep)
    present = {d.name for d in run_dirs if d.parent == sweep}
    missing = []
    for job in (str(number) for number in range(count or 0)):
        if job not in present:
            reason = "its run dir is gone" if not (sweep / job).exists() else "no config.yaml in its run dir"
            missing.append(Run(name=str(sweep / job), config={}, status="missing", problem=reason))
    return missing


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Every run under the given run dirs / sweep dirs; jobs a sweep lost are listed as missing."""
    runs = []
    for path in map(Path, paths):
        if not path.exists():
            raise ReportError(f"{path} does not exist; give a run dir (with config.yaml) or a sweep dir")
        run_dirs = run_dirs_under(path)
        missing = [
            run for sweep in sorted({path, *(d.parent for d in run_dirs)}) for run in missing_jobs(sweep, run_dirs)
        ]
        if not run_dirs and not missing:
            raise ReportError(
                f"no runs under {path}: no config.yaml of an attnlab-train run found "
                "(a run dir holds config.yaml with model, attention and trainer sections)"
            )
        runs += missing + [load_run(d) for d in run_dirs]
    if not any(run.status != "missing" for run in runs):
        raise ReportError(f"no readable runs under {', '.join(map(str, paths))}")
    return runs


def save_data(paths: list[str | Path], dest: Path) -> int:
    """Copy what a report reads of every run under ``paths`` into ``dest``, in the same layout:
    config.yaml, run.json, bleu.json, csv/version_*/metrics.csv, the first and last attention map, each
    sweep's multirun.yaml (and an Optuna study's optimization_results.yaml); no checkpoints, no
    W&B files. ``attnlab-report dest`` then rebuilds the same report. Returns the runs copied."""
    copied = 0
    for path in map(Path, paths):
        target = dest / path.name
        sweeps = {path, *(d.parent for d in run_dirs_under(path))}
        for sweep in sweeps:
            for name in ("multirun.yaml", "optimization_results.yaml"):  # the sweep; an Optuna study's best
                if (sweep / name).exists():
                    (target / sweep.relative_to(path)).mkdir(parents=True, exist_ok=True)
                    shutil.copy2(sweep / name, target / sweep.relative_to(path) / name)
        for run_dir in run_dirs_under(path):
            files = [run_dir / name for name in ("config.yaml", "run.json", "bleu.json")]
            files += (run_dir / "csv").glob("version_*/metrics.csv")
            maps = sorted((run_dir / MAPS_DIR).glob("step_*.png"))
            files += maps[:1] + maps[-1:] if len(maps) > 1 else maps  # the first and the last, as the report shows
            for file in files:
                if file.exists():
                    copy = target / file.relative_to(path)
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(file, copy)
            copied += 1
    return copied


def load_wandb_runs(project: str, group: str | None = None) -> list[Run]:
    """The same runs through the W&B public API (needs the network and a login)."""
    import wandb

    api = wandb.Api()
    filters = {"group": group} if group else {}
    runs = []
    for remote in api.runs(project, filters=filters):
        config = {key: value for key, value in remote.config.items() if not key.startswith("_")}
        rows = [
            {"step": row["trainer/global_step"], **{k: v for k, v in row.items() if isinstance(v, int | float)}}
            for row in remote.scan_history()
            if row.get("trainer/global_step") is not None
        ]
        run = Run(name=f"{project}/{remote.id}", config=config, rows=rows, wall_s=remote.summary.get("_runtime"))
        if remote.state != "finished":
            run.status = "failed" if remote.state in ("failed", "crashed") else "unfinished"
            run.problem = f"W&B state {remote.state}"
        runs.append(run)
    if not runs:
        raise ReportError(f"no W&B runs in {project}" + (f" with group {group!r}" if group else ""))
    return runs


def varying_keys(runs: list[Run]) -> list[str]:
    """Config keys whose values differ between the runs (the experiment's axes)."""
    readable = [run for run in runs if run.config]
    keys = sorted(set().union(*(run.config for run in readable)))
    varying = [
        key
        for key in keys
        if not key.startswith(NOT_COMPARED) and len({repr(run.config.get(key)) for run in readable}) > 1
    ]
    return varying


@dataclass
class Group:
    """The runs of one configuration, over seeds."""

    label: str
    settings: dict
    runs: list[Run]

    def values(self, key: str, at_step: float | None = None) -> list[float]:
        found = [run.last(key) if at_step is None else run.at_step(key, at_step) for run in self.runs]
        return [value for value in found if value is not None and not math.isnan(value)]

    def mean_std(self, key: str, at_step: float | None = None) -> tuple[float, float, int] | None:
        values = self.values(key, at_step)
        if not values:
            return None
        return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def cell(stats: tuple[float, float, int] | None, digits: int = 3) -> str:
    """(mean, std, n) as a table cell: "mean ± std", the mean alone for n = 1, "–" for nothing."""
    if stats is None:
        return "–"
    mean, std, n = stats
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def group_runs(runs: list[Run], axes: list[str]) -> list[Group]:
    """Finished runs grouped by every varying key but the seed."""
    by_setting = [key for key in axes if key != "seed"]
    finished = [run for run in runs if run.status == "finished"]

    def setting(run):
        return tuple(run.config.get(key) for key in by_setting)

    def order(run):  # numbers in numeric order (8 < 16 < 128), then everything else by text
        return tuple((0, value, "") if isinstance(value, int | float) else (1, 0, str(value)) for value in setting(run))

    groups = []
    for values, members in itertools.groupby(sorted(finished, key=order), key=setting):
        settings = dict(zip(by_setting, values, strict=True))
        # short labels for legends: the last part of each key (scale=none, n_heads=8)
        label = ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in settings.items()) or "all runs"
        groups.append(Group(label, settings, list(members)))
    return groups
