"""attnlab's DecoderLM against the same LM built from torch's nn.TransformerEncoderLayer.

    .venv/bin/python benchmarks/decoder_lm_vs_torch.py [--batch 32 --length 64 --d-model 128 --heads 4 --layers 2]

Same shapes, same embedding (scaled, sinusoidal positions, tied output head), pre-LN,
ReLU feed-forward, dropout, causal mask, the same Adam step in the same plain loop. Rounds
alternate between the two; the median step time of each and their ratio are printed, with
the per-round spread (target: attnlab / torch <= 0.9).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.models import DecoderLM, ModelConfig, sinusoidal_positions


class TorchLM(nn.Module):
    """The reference: nn.TransformerEncoder layers (torch's fused fast path where it applies)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.register_buffer("positions", sinusoidal_positions(cfg.max_len, cfg.d_model), persistent=False)
        self.scale = math.sqrt(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, batch_first=True, norm_first=cfg.pre_norm
        )
        self.layers = nn.TransformerEncoder(
            layer, cfg.n_layers, norm=nn.LayerNorm(cfg.d_model), enable_nested_tensor=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.dropout(self.tokens(tokens) * self.scale + self.positions[:length])
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        return self.layers(x, mask=causal, is_causal=True) @ self.tokens.weight.T  # tied head


def step_time(model: nn.Module, tokens: torch.Tensor, steps: int) -> float:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()
    start = time.perf_counter()
    for _ in range(steps):
        logits = model(tokens[:, :-1]) if isinstance(model, TorchLM) else model(tokens[:, :-1], None)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=500)
    parser.add_argument("--steps", type=int, default=5, help="steps per timing round")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_heads=args.heads, d_ff=4 * args.d_model,
                      n_layers=args.layers, dropout=0.1, pre_norm=True)  # fmt: skip
    models = {"torch": TorchLM(cfg), "attnlab": DecoderLM(cfg)}
    tokens = torch.randint(0, args.vocab, (args.batch, args.length + 1))
    for model in models.values():  # warm-up
        step_time(model, tokens, 2)
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_number in range(args.rounds):
        order = list(models) if round_number % 2 == 0 else list(models)[::-1]
        for name in order:
            times[name].append(step_time(models[name], tokens, args.steps))
    median = {name: statistics.median(values) for name, values in times.items()}
    ratios = sorted(ours / ref for ours, ref in zip(times["attnlab"], times["torch"], strict=True))
    print(f"threads={torch.get_num_threads()} batch={args.batch} length={args.length} d_model={args.d_model} "
          f"heads={args.heads} layers={args.layers} torch={torch.__version__}")  # fmt: skip
    for name, seconds in median.items():
        print(f"{name:>8}: {seconds * 1e3:8.1f} ms/step")
    print(f"attnlab / torch = {median['attnlab'] / median['torch']:.3f} (target <= 0.9); "
          f"per round {ratios[0]:.3f} … {ratios[-1]:.3f}, median {statistics.median(ratios):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
