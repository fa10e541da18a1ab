"""The cost of Lightning: attnlab's SequenceTask under a Trainer against a plain PyTorch loop.

    .venv/bin/python benchmarks/lightning_overhead.py [--steps 300 --rounds 3] [hydra overrides …]

Both run the same model, data stream, optimiser, schedule and gradient clipping for the
same number of steps in the same process, alternating, and the median of each is
printed with their ratio (target: Lightning within 3%, ratio <= 1.03, with the per-round spread). Both clocks run
from the end of the first WARMUP steps to the last step, so one-off set-up (the
Trainer's, the data loader's first batch) is left out of both. Lightning runs
with what a real run keeps on (the task's own metric logging, into a CSV logger), but no
validation or checkpoints, which the plain loop has no counterpart for.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf

from attnlab.data import build_data
from attnlab.data.module import IGNORE
from attnlab.lifecycle import StepSeed
from attnlab.models import sequence_loss
from attnlab.optim import build_optimizer
from attnlab.perf import Throughput
from attnlab.task import SequenceTask
from attnlab.train import CONF_DIR


def load_config(overrides: list[str]):
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    cfg.run_dir = cfg.paths.cache_dir = tempfile.mkdtemp()
    return OmegaConf.to_container(cfg, resolve=True), cfg


WARMUP = 10


class StepClock(L.Callback):
    """Seconds from the start of step WARMUP to the end of the last step."""

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == WARMUP:
            self.start = time.perf_counter()

    def on_train_end(self, trainer, *args):
        self.seconds = time.perf_counter() - self.start


def plain_loop(config: dict, cfg, steps: int) -> float:
    """Seconds for the optimizer steps after WARMUP, written by hand."""
    torch.manual_seed(config["seed"])
    data = build_data(cfg.data, cfg.model.kind, cfg.seed, cfg.paths.cache_dir)
    task = SequenceTask(config, data.vocab)  # only for its forward; no Trainer attached
    optimizer, schedule = build_optimizer(task.model, config["optim"], steps)
    batches = iter(data.train_dataloader())
    task.train()
    for step in range(steps):
        if step == WARMUP:
            start = time.perf_counter()
        batch = next(batches)
        logits, targets = task(batch)
        loss = sequence_loss(logits, targets, IGNORE, config["optim"]["label_smoothing"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(task.parameters(), config["trainer"]["gradient_clip_val"])
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # Lightning reads the loss each step too (progress, logging)
    return time.perf_counter() - start


def lightning_loop(config: dict, cfg, steps: int, callbacks: tuple = ()) -> float:
    torch.manual_seed(config["seed"])
    data = build_data(cfg.data, cfg.model.kind, cfg.seed, cfg.paths.cache_dir)
    task = SequenceTask(config, data.vocab)
    clock = StepClock()
    trainer = L.Trainer(
        callbacks=[clock, StepSeed(config["seed"]), Throughput(), *callbacks],  # what every run has
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        gradient_clip_val=config["trainer"]["gradient_clip_val"],
        log_every_n_steps=config["trainer"]["log_every_n_steps"],
        limit_val_batches=0,
        logger=CSVLogger(tempfile.mkdtemp()),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(task, datamodule=data)
    return clock.seconds


def parse_args(doc: str, rounds: int) -> argparse.Namespace:
    """--steps, --rounds and Hydra overrides: what every training benchmark here takes."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("overrides", nargs="*", help="hydra overrides, e.g. data=reverse model.d_model=128")
    return parser.parse_args()


def main() -> None:
    args = parse_args(__doc__, rounds=4)
    config, cfg = load_config(args.overrides)

    loops = {"plain": plain_loop, "lightning": lightning_loop}
    times = {name: [] for name in loops}
    for round_number in range(args.rounds):
        order = list(loops) if round_number % 2 == 0 else list(loops)[::-1]
        for name in order:
            times[name].append(loops[name](config, cfg, args.steps))
    plain, lightning = (statistics.median(times[name]) for name in ("plain", "lightning"))
    print(f"model={cfg.model.kind} d_model={cfg.model.d_model} data={cfg.data.name} steps={args.steps} "
          f"rounds={args.rounds} threads={torch.get_num_threads()}")  # fmt: skip
    timed = args.steps - WARMUP
    print(f"plain PyTorch loop: {plain:.2f} s for {timed} steps ({timed / plain:.1f} steps/s)")
    print(f"Lightning Trainer : {lightning:.2f} s for {timed} steps ({timed / lightning:.1f} steps/s)")
    print("per round (s):", {name: [round(t, 2) for t in values] for name, values in times.items()})
    ratios = sorted(light / bare for light, bare in zip(times["lightning"], times["plain"], strict=True))
    print(f"Lightning / plain = {lightning / plain:.3f} (target <= 1.03); per round {ratios[0]:.3f} … "
          f"{ratios[-1]:.3f}, median {statistics.median(ratios):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
