"""torch.compile against eager: the same plain training loop, model.compile=true and false.

    .venv/bin/python benchmarks/compile_speed.py [--steps 300 --rounds 3] [hydra overrides …]

Both run benchmarks/lightning_overhead.py's plain PyTorch loop (same model, data stream,
optimiser, schedule, clipping) in the same process, alternating. The clock starts after
the first WARMUP steps, so compiling (and recompiling once for dynamic shapes) is left
out of the ratio and printed apart, as the seconds until the clock starts.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from lightning_overhead import WARMUP, load_config, parse_args, plain_loop


def main() -> None:
    args = parse_args(__doc__, rounds=3)
    eager_config, cfg = load_config(args.overrides)
    compiled_config = copy.deepcopy(eager_config)
    compiled_config["model"]["compile"] = True
    configs = {"eager": eager_config, "compiled": compiled_config}
    times = {name: [] for name in configs}
    setup = {name: [] for name in configs}
    for round_number in range(args.rounds):
        order = list(configs) if round_number % 2 == 0 else list(configs)[::-1]
        for name in order:
            torch._dynamo.reset()  # each round compiles afresh (the on-disk cache may still help)
            start = time.perf_counter()
            seconds = plain_loop(configs[name], cfg, args.steps)
            times[name].append(seconds)
            setup[name].append(time.perf_counter() - start - seconds)
    eager, compiled = (statistics.median(times[name]) for name in configs)
    print(f"model={cfg.model.kind} d_model={cfg.model.d_model} data={cfg.data.name} steps={args.steps} "
          f"rounds={args.rounds} threads={torch.get_num_threads()} torch={torch.__version__}")  # fmt: skip
    timed = args.steps - WARMUP
    for name, median in (("eager", eager), ("compiled", compiled)):
        print(f"{name:8s}: {median:.2f} s for {timed} steps ({timed / median:.1f} steps/s); set-up and first "
              f"{WARMUP} steps {statistics.median(setup[name]):.1f} s")  # fmt: skip
    print("per round (s):", {name: [round(t, 2) for t in values] for name, values in times.items()})
    ratios = sorted(c / e for c, e in zip(times["compiled"], times["eager"], strict=True))
    print(f"compiled / eager = {compiled / eager:.3f}; per round {ratios[0]:.3f} … {ratios[-1]:.3f}")


if __name__ == "__main__":
    main()
