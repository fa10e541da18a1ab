"""What the probes cost: training throughput with probes off, at the default interval, every step.

    .venv/bin/python benchmarks/probe_overhead.py [--steps 300 --rounds 3] [hydra overrides …]

The three settings run the same Lightning training (benchmarks/lightning_overhead.py)
in the same process, alternating; medians and ratios to "off" are printed.

Whole runs drift with this VM's speed (±15% from one run to the next), so the cost of a
probe step is also measured within one run: probes every 2 steps, each step timed, and
the median probe step over the median other step; the two kinds alternate step by step,
so drift cancels. That ratio is what probing every step costs; the default interval costs
1 + (ratio − 1) / interval. Targets: every step <= 1.15, the default interval <= 1.02.
"""

from __future__ import annotations

import statistics
import time

import lightning as L
import torch

from attnlab.probes import build_probes
from lightning_overhead import WARMUP, lightning_loop, load_config, parse_args


class StepTimes(L.Callback):
    """Seconds of each training step, from one step's start to the next one's."""

    def __init__(self):
        self.starts: list[tuple[int, float]] = []

    def on_train_batch_start(self, trainer, *args) -> None:
        self.starts.append((trainer.global_step, time.perf_counter()))

    def seconds(self) -> list[tuple[int, float]]:
        pairs = zip(self.starts, self.starts[1:], strict=False)  # the last step has no successor
        return [(step, later - now) for (step, now), (_, later) in pairs if step >= WARMUP]


def main() -> None:
    args = parse_args(__doc__, rounds=3)
    config, cfg = load_config(args.overrides)
    default_every = cfg.callbacks.probes.every_n_steps

    def probes(every):
        probe_cfg = cfg.callbacks.probes.copy()
        probe_cfg.every_n_steps = every
        return build_probes(probe_cfg)

    settings = {
        "off": lambda: (),
        f"every {default_every}": lambda: probes(default_every),
        "every 1": lambda: probes(1),
    }
    times = {name: [] for name in settings}
    for round_number in range(args.rounds):
        order = list(settings) if round_number % 2 == 0 else list(settings)[::-1]
        for name in order:
            times[name].append(lightning_loop(config, cfg, args.steps, settings[name]()))
    median = {name: statistics.median(values) for name, values in times.items()}
    timed = args.steps - WARMUP
    model = cfg.model
    print(f"model={model.kind} d_model={model.d_model} layers={model.n_layers} data={cfg.data.name} "
          f"steps={timed} rounds={args.rounds} threads={torch.get_num_threads()}")  # fmt: skip
    for name, seconds in median.items():
        print(f"probes {name:>9}: {timed / seconds:6.1f} steps/s   time / off = {seconds / median['off']:.3f}")
    print("per round (s):", {name: [round(t, 2) for t in values] for name, values in times.items()})

    ratios = []
    for _ in range(args.rounds):
        clock = StepTimes()
        lightning_loop(config, cfg, args.steps, (*probes(2), clock))
        probe_steps = [seconds for step, seconds in clock.seconds() if step % 2 == 0]
        other_steps = [seconds for step, seconds in clock.seconds() if step % 2 == 1]
        ratios.append(statistics.median(probe_steps) / statistics.median(other_steps))
    ratio = statistics.median(ratios)
    print(f"within a run (probes every 2 steps): probe step / other step = {ratio:.3f} (target <= 1.15); "
          f"per round {min(ratios):.3f} … {max(ratios):.3f}; so every {default_every} steps ≈ "
          f"{1 + (ratio - 1) / default_every:.3f} (target <= 1.02)")  # fmt: skip


if __name__ == "__main__":
    main()
