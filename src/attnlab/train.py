"""`attnlab-train`: the Hydra entry point. One run, or a sweep with ``-m``.

    seed → data → LightningModule → callbacks → loggers → Trainer → fit → test

Every run dir holds ``config.yaml`` (the resolved config), ``run.json`` (its W&B id and
how it ended), ``checkpoints/`` (best and last), ``csv/version_*/metrics.csv`` (the local
mirror of what W&B gets, same keys; one version per start) and ``wandb/``.
Resume an interrupted run with ``attnlab-train resume=<its run dir>``: it continues in
that dir from ``checkpoints/last.ckpt`` with the run's own saved config and W&B run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from attnlab.averaging import CheckpointAveraging, write_average
from attnlab.config import validate
from attnlab.console import StepProgressBar, parameters_line, quiet_foreign_noise, summary
from attnlab.data import DATASETS, build_data
from attnlab.distributed import Workers
from attnlab.lengths import LengthGeneralisation
from attnlab.lifecycle import (
    AtomicCheckpointIO,
    BestCheckpoint,
    GracefulStop,
    LastCheckpoint,
    MetricsCSVLogger,
    StepSeed,
    under_slurm,
)
from attnlab.perf import Throughput
from attnlab.probes import build_probes
from attnlab.rundir import (
    ON_RESUME,
    atomic_write,
    check_resume,
    end_run,
    override_keys,
    run_dir_for,
    start_run,
    unique_dir,
)
from attnlab.runs import flatten
from attnlab.task import SequenceTask

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
# hydra.run.dir is the run being resumed when resume= names one, else a new unique dir;
# hydra.sweep.dir a new unique dir. Cached: each is created once per config (and sweep).
OmegaConf.register_new_resolver("attnlab_run_dir", run_dir_for, replace=True, use_cache=True)
OmegaConf.register_new_resolver("attnlab_unique_dir", unique_dir, replace=True, use_cache=True)
# ${attnlab_mul:a,b} = a·b, for sweeps that tie sizes together (d_model = n_heads · d_k).
OmegaConf.register_new_resolver("attnlab_mul", lambda a, b: a * b, replace=True)
# ${attnlab_div:a,b} = a // b, for rows sized relative to d_model (conf/table3/B_*.yaml).
OmegaConf.register_new_resolver("attnlab_div", lambda a, b: a // b, replace=True)
# A resumed run keeps the .hydra/ of its first start and writes its own beside it.
OmegaConf.register_new_resolver(
    "attnlab_hydra_subdir", lambda resume: ".hydra-resume" if resume else ".hydra", replace=True
)


def is_rank_zero() -> bool:
    """Rank 0 by every variable a launcher sets (torchrun/DDP children, SLURM), before any Trainer exists."""
    return all(os.environ.get(var, "0") == "0" for var in ("LOCAL_RANK", "RANK", "SLURM_PROCID"))


def resumed_config(cfg: DictConfig, resume: str, overrides) -> DictConfig:
    """The run's own saved config, running in ``resume``; overrides as check_resume allows."""
    run_dir = check_resume(str(resume), overrides)
    resumed = OmegaConf.load(run_dir / "config.yaml")
    if "paths" not in resumed:  # saved before conf/paths existed
        resumed.paths = {"cache_dir": resumed.pop("cache_dir"), "outputs": "outputs", "multirun": "multirun"}
    if "tau_init" in resumed.attention:  # saved before the rules took their options from scale_options
        learned = {"init": resumed.attention.pop("tau_init"), "per_head": resumed.attention.pop("tau_per_head")}
        resumed.attention.scale_options = {"learned": learned}
    if "bleu_batches" in resumed.data:  # saved before data.bleu and data.max_length (then named max_tokens)
        resumed.data.pop("bleu_batches")
        resumed.data.bleu = OmegaConf.load(Path(CONF_DIR) / "data" / "translation.yaml").bleu
        resumed.data.max_length = resumed.data.pop("max_tokens")
    if "average" not in resumed.callbacks:  # saved before checkpoint averaging
        resumed.callbacks.average = OmegaConf.load(Path(CONF_DIR) / "callbacks" / "default.yaml").average
    resumed.resume = str(run_dir)
    resumed.run_dir = str(run_dir.resolve())  # here, wherever the run first lived
    for key in set(override_keys(overrides)) & set(ON_RESUME):
        OmegaConf.update(resumed, key, OmegaConf.select(cfg, key))
    return resumed


def wandb_settings(cfg: DictConfig) -> dict:
    """group = the sweep (or experiment), tags = experiment + this job's overrides."""
    hydra_cfg = HydraConfig.get()
    group = cfg.name
    if hydra_cfg.mode == RunMode.MULTIRUN:
        group = f"{cfg.name}-{Path(hydra_cfg.sweep.dir).name}"
    tags = [cfg.name, *[override[:64] for override in hydra_cfg.overrides.task if "=" in override]]
    return {"group": cfg.logger.group or group, "tags": [*tags, *cfg.logger.tags]}


def build_loggers(cfg: DictConfig, run_dir: Path, flat_config: dict, wandb_id: str) -> list:
    loggers = []
    if cfg.logger.csv:
        # csv/version_<k>/metrics.csv: a resumed run appends a new version, never overwrites.
        loggers.append(MetricsCSVLogger(save_dir=run_dir, name="csv"))
    if cfg.logger.wandb:
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline" if "WANDB_API_KEY" not in os.environ else "online")
        settings = wandb_settings(cfg)
        loggers.append(
            WandbLogger(
                project=cfg.logger.project,
                entity=cfg.logger.entity,
                save_dir=str(run_dir),
                offline=mode != "online",
                id=wandb_id,  # from run.json: resuming continues the same W&B run
                resume="allow",
                job_type="train",
                config=flat_config,
                settings=wandb.Settings(quiet=True),  # no history sparklines: attnlab prints its own summary
                **settings,
            )
        )
    return [*loggers, *build_extra(cfg.logger.extra)]


def build_callbacks(cfg: DictConfig, run_dir: Path, stop: GracefulStop) -> list:
    """The dropout seed of each step, throughput, best.ckpt at each validation (by
    optimized_metric), last.ckpt every few steps and at the last step (which validates),
    saving on SIGTERM/SIGINT, and the probes."""
    checkpoints = run_dir / "checkpoints"
    best = BestCheckpoint(dirpath=checkpoints, filename="best", monitor=cfg.optimized_metric, mode="min", save_top_k=1)
    ends = [LastCheckpoint(checkpoints / "last.ckpt", cfg.callbacks.checkpoint_every_n_steps), stop]
    average = cfg.callbacks.average
    if average.last_k:
        ends.insert(0, CheckpointAveraging(checkpoints / "average", average.every_n_steps, average.last_k))
    probes = build_probes(cfg.callbacks.get("probes"))
    probes += [LengthGeneralisation(cfg.data, cfg.seed)] if cfg.data.get("eval_lengths") else []
    progress = [StepProgressBar()] if cfg.trainer.enable_progress_bar else []
    return [StepSeed(cfg.seed), Throughput(), best, *ends, *probes, *progress, *build_extra(cfg.callbacks.extra)]


def build_extra(node: DictConfig) -> list:
    """The Lightning callbacks or loggers a config adds by ``_target_`` (``null`` ones are off)."""
    return [built(spec) for spec in OmegaConf.to_container(node, resolve=True).values() if spec is not None]


def built(value):
    """A Trainer argument given as {_target_: …} (e.g. a profiler) is built; others pass as they are."""
    return instantiate(value) if isinstance(value, dict) and "_target_" in value else value


def finish_wandb(exit_code: int, preempted: bool = False) -> None:
    import wandb

    if wandb.run is None:
        return
    try:
        if preempted:
            wandb.run.mark_preempting()
        wandb.run.finish(exit_code=exit_code)
    except Exception as error:  # e.g. SLURM's SIGTERM stopped W&B's service first: what it wrote is kept
        print(f"attnlab: W&B could not finish the run cleanly ({exception_line(error)})", file=sys.stderr)


def exception_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:500]


def restarted_slurm_job(run_dir: Path) -> bool:
    """A SLURM job started again (requeued: preemption, time limit, scontrol requeue) whose
    run dir already holds a checkpoint: it continues from there."""
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    return restarts > 0 and (run_dir / "checkpoints" / "last.ckpt").is_file()


def train(cfg: DictConfig, extra_callbacks: tuple = ()) -> float:
    if not cfg.resume and restarted_slurm_job(Path(cfg.run_dir)):
        cfg = resumed_config(cfg, cfg.run_dir, overrides=())  # the job's own overrides made that config
    elif cfg.resume:
        cfg = resumed_config(cfg, cfg.resume, HydraConfig.get().overrides.task)
    validate(cfg, DATASETS)
    quiet_foreign_noise()
    started = time.monotonic()
    run_dir = Path(cfg.run_dir)
    config_file = run_dir / "config.yaml"
    writes = is_rank_zero()
    if writes:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not cfg.resume:
            atomic_write(config_file, OmegaConf.to_yaml(cfg, resolve=True))  # half a config: unresumable
        record = start_run(run_dir, resumed=bool(cfg.resume))
    resolved = OmegaConf.to_container(cfg, resolve=True)

    with Workers(resolved["trainer"], run_dir, config_file, resume=bool(cfg.resume)):
        trainer = None
        last = run_dir / "checkpoints" / "last.ckpt"
        stop = GracefulStop(last)  # before the data loads: under SLURM it holds an early USR1
        try:
            L.seed_everything(cfg.seed, workers=True)
            data = build_data(cfg.data, cfg.model.kind, cfg.seed, Path(cfg.paths.cache_dir))
            task = SequenceTask(resolved, data.vocab)
            if writes:
                print(parameters_line(task.model), file=sys.stderr, flush=True)
            loggers = build_loggers(cfg, run_dir, flatten(resolved), record["wandb_id"]) if writes else []
            callbacks = [*build_callbacks(cfg, run_dir, stop), *extra_callbacks]
            trainer = L.Trainer(
                **{key: built(value) for key, value in resolved["trainer"].items()},
                default_root_dir=run_dir,
                callbacks=callbacks,
                logger=loggers or False,
                # Under SLURM, attnlab saves and requeues on USR1/USR2 itself (lifecycle.py), not Lightning.
                plugins=[AtomicCheckpointIO(), *([SLURMEnvironment(auto_requeue=False)] if under_slurm() else [])],
                use_distributed_sampler=False,  # the data module shards its own stream
            )
            trainer.fit(task, datamodule=data, ckpt_path=str(last) if cfg.resume else None)
            final = dict(trainer.callback_metrics)  # the last validation's; the test adds its own
            best = trainer.checkpoint_callback  # the first ModelCheckpoint: by optimized_metric
            tested = best.best_model_path or None
            if cfg.callbacks.average.last_k:
                tested = str(run_dir / "checkpoints" / "averaged.ckpt")
                if writes:
                    write_average(run_dir / "checkpoints" / "average", cfg.callbacks.average.last_k, Path(tested))
                trainer.strategy.barrier()
            if cfg.test:
                trainer.test(task, datamodule=data, ckpt_path=tested)
                final.update(trainer.callback_metrics)
        except SIGTERMException:
            interrupted = stop.interrupted(run_dir, trainer.global_step)
            if writes:
                end_run(run_dir, "interrupted", trainer.global_step, interrupted.message)
                finish_wandb(exit_code=interrupted.code, preempted=True)
                print(interrupted.message, file=sys.stderr, flush=True)
            if stop.requeues:
                stop.requeue()  # submitit requeues and exits (or fails the job: time-outs used up)
            raise interrupted from None
        except BaseException as error:
            if writes:
                state = "diverged" if isinstance(error, FloatingPointError) else "failed"
                end_run(run_dir, state, trainer.global_step if trainer else 0, exception_line(error))
                finish_wandb(exit_code=1)  # marked failed; the next sweep job gets a run of its own
            raise
        if writes:
            end_run(run_dir, "finished", trainer.global_step)
            finish_wandb(exit_code=0)
            wandb_dir = run_dir / "wandb" if cfg.logger.wandb else None
            print(
                summary(run_dir, trainer, final, best.best_model_path, started, wandb_dir, tested),
                file=sys.stderr,
                flush=True,
            )
    score = best.best_model_score
    return float(score) if score is not None else float("nan")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float:
    return train(cfg)


if __name__ == "__main__":
    main()
