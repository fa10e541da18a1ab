"""`attnlab-train`: the Hydra entry point. One run, or a sweep with ``-m``.

    seed → data → LightningModule → callbacks → loggers → Trainer → fit → test

Every run dir holds ``config.yaml`` (the resolved config), ``checkpoints/`` (best and
last), ``csv/version_*/metrics.csv`` (the local mirror of what W&B gets, same keys; one
version per start) and ``wandb/``.
Resume an interrupted run with ``attnlab-train resume=<its run dir>``: it continues from
``checkpoints/last.ckpt`` with the run's own saved config and the same W&B run.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from attnlab.config import ConfigError, validate
from attnlab.data import DATASETS, build_data
from attnlab.distributed import Workers
from attnlab.probes import build_probes
from attnlab.runs import flatten
from attnlab.task import SequenceTask

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
# hydra.run.dir is the run being resumed when resume= names one, else a fresh dir.
OmegaConf.register_new_resolver("attnlab_run_dir", lambda resume, fresh: resume or fresh, replace=True)
# A resumed run keeps the .hydra/ of its first start and writes its own beside it.
OmegaConf.register_new_resolver(
    "attnlab_hydra_subdir", lambda resume: ".hydra-resume" if resume else ".hydra", replace=True
)


def is_rank_zero() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0"


def resumed_config(cfg: DictConfig) -> DictConfig:
    """With resume=DIR, the run's own saved config; a trainer.max_steps=… given now extends it."""
    run_dir = Path(cfg.resume)
    saved, last = run_dir / "config.yaml", run_dir / "checkpoints" / "last.ckpt"
    for path in (saved, last):
        if not path.exists():
            raise ConfigError(f"resume={cfg.resume!r}: {path} does not exist; point resume at a run dir")
    resumed = OmegaConf.load(saved)
    resumed.resume = str(run_dir)
    given = {override.split("=", 1)[0].lstrip("+~") for override in HydraConfig.get().overrides.task}
    if "trainer.max_steps" in given:
        resumed.trainer.max_steps = cfg.trainer.max_steps
    return resumed


def wandb_settings(cfg: DictConfig) -> dict:
    """group = the sweep (or experiment), tags = experiment + this job's overrides."""
    hydra_cfg = HydraConfig.get()
    group = cfg.name
    if hydra_cfg.mode == RunMode.MULTIRUN:
        group = f"{cfg.name}-{Path(hydra_cfg.sweep.dir).name}"
    tags = [cfg.name, *[override[:64] for override in hydra_cfg.overrides.task if "=" in override]]
    return {"group": cfg.logger.group or group, "tags": [*tags, *cfg.logger.tags]}


def build_loggers(cfg: DictConfig, run_dir: Path, flat_config: dict) -> list:
    loggers = []
    if cfg.logger.csv:
        # csv/version_<k>/metrics.csv: a resumed run appends a new version, never overwrites.
        loggers.append(CSVLogger(save_dir=run_dir, name="csv"))
    if cfg.logger.wandb:
        mode = os.environ.get("WANDB_MODE", "offline" if "WANDB_API_KEY" not in os.environ else "online")
        settings = wandb_settings(cfg)
        loggers.append(
            WandbLogger(
                project=cfg.logger.project,
                entity=cfg.logger.entity,
                save_dir=str(run_dir),
                offline=mode != "online",
                # The same run dir is the same W&B run: resuming continues it.
                id=hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16],
                resume="allow",
                job_type="train",
                config=flat_config,
                **settings,
            )
        )
    return loggers


def build_callbacks(cfg: DictConfig, run_dir: Path) -> list:
    """best.ckpt at each validation (by optimized_metric), last.ckpt every few steps (for
    resume), and the probes."""
    best = ModelCheckpoint(
        dirpath=run_dir / "checkpoints",
        filename="best",
        monitor=cfg.optimized_metric,
        mode="min",
        save_top_k=1,
    )
    last = ModelCheckpoint(
        dirpath=run_dir / "checkpoints",
        save_top_k=0,
        save_last=True,
        every_n_train_steps=cfg.callbacks.checkpoint_every_n_steps,
    )
    return [best, last, *build_probes(cfg.callbacks.get("probes"))]


def finish_wandb(exit_code: int) -> None:
    import wandb

    if wandb.run is not None:
        wandb.run.finish(exit_code=exit_code)


def train(cfg: DictConfig, extra_callbacks: tuple = ()) -> float:
    if cfg.resume:
        cfg = resumed_config(cfg)
    validate(cfg, DATASETS)
    run_dir = Path(cfg.run_dir)
    config_file = run_dir / "config.yaml"
    if is_rank_zero() and not cfg.resume:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, config_file, resolve=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)

    with Workers(resolved["trainer"], run_dir, config_file):
        L.seed_everything(cfg.seed, workers=True)
        data = build_data(cfg.data, cfg.model.kind, cfg.seed, Path(cfg.cache_dir))
        task = SequenceTask(resolved, data.vocab)
        loggers = build_loggers(cfg, run_dir, flatten(resolved))
        trainer = L.Trainer(
            **resolved["trainer"],
            default_root_dir=run_dir,
            callbacks=[*build_callbacks(cfg, run_dir), *extra_callbacks],
            logger=loggers or False,
            use_distributed_sampler=False,  # the data module shards its own stream
        )
        last = run_dir / "checkpoints" / "last.ckpt"
        try:
            trainer.fit(task, datamodule=data, ckpt_path=str(last) if cfg.resume else None)
            best = trainer.checkpoint_callback  # the first ModelCheckpoint: by optimized_metric
            if cfg.test:
                trainer.test(task, datamodule=data, ckpt_path=best.best_model_path or None)
        except BaseException:
            finish_wandb(exit_code=1)  # marked failed; the next sweep job gets a run of its own
            raise
        finish_wandb(exit_code=0)
    score = best.best_model_score
    return float(score) if score is not None else float("nan")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float:
    return train(cfg)


if __name__ == "__main__":
    main()
