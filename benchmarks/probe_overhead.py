"""What the probes cost: training throughput with probes off, at the default interval, every step.

    .venv/bin/python benchmarks/probe_overhead.py [--steps 300 --rounds 3] [hydra overrides …]

The three settings run the same Lightning training (benchmarks/lightning_overhead.py)
in the same process, alternating; medians and ratios to "off" are printed. Target: the
default interval costs <= 5% against probes off.
"""

from __future__ import annotations

import statistics

import torch

from attnlab.probes import build_probes
from lightning_overhead import WARMUP, lightning_loop, load_config, parse_args


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


if __name__ == "__main__":
    main()
