"""One attention layer, forward + backward: attnlab's fast path against nn.MultiheadAttention.

    .venv/bin/python benchmarks/attention_speed.py [--batch 32 --length 128 --d-model 256 --heads 8]

Both layers see the same shapes in the same process; every timing is the median of
interleaved rounds, and each rule is printed as a ratio to torch's layer (target ≤ 1.0)
and ``learned`` as a ratio to ``sqrt_dk`` (target ≤ 1.02), with its spread over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from attnlab.attention import AttentionConfig, MultiHeadAttention

RULES = ["none", "sqrt_dk", "dk", "learned"]


def step_time(layer: nn.Module, x: torch.Tensor, call, iters: int) -> float:
    """Seconds per forward + backward, averaged over ``iters`` steps."""
    start = time.perf_counter()
    for _ in range(iters):
        call(layer, x).sum().backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--iters", type=int, default=10, help="steps per timing round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median taken)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    x = torch.randn(args.batch, args.length, args.d_model, device=device, requires_grad=True)
    future = torch.ones(args.length, args.length, dtype=torch.bool, device=device).triu(1)

    def torch_call(layer, x):
        if args.causal:
            return layer(x, x, x, attn_mask=future, is_causal=True, need_weights=False)[0]
        return layer(x, x, x, need_weights=False)[0]

    def ours_call(layer, x):
        return layer(x, causal=args.causal)

    layers = {
        "nn.MultiheadAttention": (
            nn.MultiheadAttention(args.d_model, args.heads, batch_first=True),
            torch_call,
        )
    }
    for rule in RULES:
        layers[rule] = (
            MultiHeadAttention(args.d_model, args.heads, attn=AttentionConfig(scale=rule)),
            ours_call,
        )

    times: dict[str, list[float]] = {name: [] for name in layers}
    for layer, call in layers.values():  # warm-up
        layer.to(device)
        step_time(layer, x, call, 2)
    for _ in range(args.rounds):
        for name, (layer, call) in layers.items():
            times[name].append(step_time(layer, x, call, args.iters))
    median = {name: statistics.median(values) for name, values in times.items()}

    print(
        f"device={device} threads={torch.get_num_threads()} batch={args.batch} length={args.length} "
        f"d_model={args.d_model} heads={args.heads} causal={args.causal} torch={torch.__version__}"
    )
    reference = median["nn.MultiheadAttention"]
    print(f"{'layer':>22}  {'ms/step':>8}  {'vs torch MHA':>12}")
    for name, seconds in median.items():
        print(f"{name:>22}  {seconds * 1e3:8.2f}  {seconds / reference:12.3f}")
    # Per round: the two layers ran back to back, so each round's ratio shares the machine's state.
    ratios = sorted(learned / fixed for learned, fixed in zip(times["learned"], times["sqrt_dk"], strict=True))
    print(f"learned / sqrt_dk = {median['learned'] / median['sqrt_dk']:.3f} (target <= 1.02); "
          f"per round {ratios[0]:.3f} … {ratios[-1]:.3f}, median {statistics.median(ratios):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
