"""One attention layer, forward + backward: attnlab's fast path against nn.MultiheadAttention.

    .venv/bin/python benchmarks/attention_speed.py [--batch 32 --length 128 --d-model 256 --heads 8]

Both layers see the same shapes in the same process; every timing is the median of
interleaved rounds, and each rule is printed as a ratio to torch's layer (target ≤ 1.0)
and to ``sqrt_dk`` (``learned``: target ≤ 1.02), with its spread over rounds. ``log_n``
and ``ssmax`` compute τ per query row (``--padded`` gives them a padding mask to count
from); ``sqrt_dk+softcap`` takes the explicit path (there is no fused soft cap).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from attnlab.attention import AttentionConfig, MultiHeadAttention

RULES = ["none", "sqrt_dk", "dk", "mup", "learned", "log_n", "ssmax"]


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
    parser.add_argument("--padded", action="store_true", help="a key mask: each sequence loses a random tail")
    parser.add_argument("--iters", type=int, default=10, help="steps per timing round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median taken)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    x = torch.randn(args.batch, args.length, args.d_model, device=device, requires_grad=True)
    future = torch.ones(args.length, args.length, dtype=torch.bool, device=device).triu(1)
    lengths = torch.randint(args.length // 2, args.length + 1, (args.batch, 1), device=device)
    real = torch.arange(args.length, device=device) < lengths if args.padded else None

    def torch_call(layer, x):
        padding = None if real is None else ~real
        if args.causal:
            return layer(x, x, x, attn_mask=future, key_padding_mask=padding, need_weights=False)[0]
        return layer(x, x, x, key_padding_mask=padding, need_weights=False)[0]

    def ours_call(layer, x):
        return layer(x, key_mask=real, causal=args.causal)

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
    capped = AttentionConfig(scale="sqrt_dk", softcap=50.0)
    layers["sqrt_dk+softcap"] = (MultiHeadAttention(args.d_model, args.heads, attn=capped), ours_call)

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
        f"d_model={args.d_model} heads={args.heads} causal={args.causal} padded={args.padded} "
        f"torch={torch.__version__}"
    )
    reference = median["nn.MultiheadAttention"]
    print(f"{'layer':>22}  {'ms/step':>8}  {'vs torch MHA':>12}  {'vs sqrt_dk':>10}  per round vs sqrt_dk")
    for name, seconds in median.items():
        # Per round: the layers ran back to back, so each round's ratio shares the machine's state.
        ratios = sorted(mine / fixed for mine, fixed in zip(times[name], times["sqrt_dk"], strict=True))
        print(f"{name:>22}  {seconds * 1e3:8.2f}  {seconds / reference:12.3f}  "
              f"{seconds / median['sqrt_dk']:10.3f}  {ratios[0]:.3f} … {ratios[-1]:.3f}")  # fmt: skip
    print(f"learned / sqrt_dk = {median['learned'] / median['sqrt_dk']:.3f} (target <= 1.02)")


if __name__ == "__main__":
    main()
