"""Tokens/s, MFU and peak memory against sequence length, for the paper's base Transformer
and a GPT-2-small-sized (~124M) decoder LM, in bf16 on a GPU with SDPA's flash backend.

    .venv/bin/python benchmarks/gpu_scaling.py --out gpu_scaling.json            # on a GPU
    .venv/bin/python benchmarks/gpu_scaling.py --tiny --device cpu --steps 2     # a smoke run anywhere

Every step holds the same number of tokens (``--tokens``; batch = tokens / length), so with
attention that is O(n) in memory (the fast path: SDPA, no n×n matrix kept) the peak memory
stays nearly flat as the length grows, while the attention FLOPs per token grow with n.
Batches have no padding (no mask), so SDPA can take its flash kernel; on a GPU the flash
backend is required (``sdpa_kernel``) and a shape it cannot run is an error, not a silent
fallback. A training step is forward, loss, backward and an AdamW step; the clock covers
``--steps`` steps after ``--warmup``. MFU uses the model's own FLOP count (attnlab.perf).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlab.models import DecoderLM, ModelConfig, Transformer, sequence_loss
from attnlab.perf import peak_flops

MODELS = {
    # Vaswani et al. 2017 base: N=6, d_model=512, h=8, d_ff=2048; a 37k shared vocabulary.
    "transformer_base": (Transformer, {"vocab_size": 37000, "d_model": 512, "n_heads": 8, "d_ff": 2048, "n_layers": 6}),
    # GPT-2 small's shape (124M with its 50,257-token vocabulary), pre-LN.
    "lm_124m": (
        DecoderLM,
        {"vocab_size": 50304, "d_model": 768, "n_heads": 12, "d_ff": 3072, "n_layers": 12, "pre_norm": True},
    ),
}
TINY = {"d_model": 64, "n_heads": 4, "d_ff": 128, "n_layers": 2, "vocab_size": 500}


def make_batch(kind: type, size: int, length: int, vocab: int, device: torch.device) -> dict:
    tokens = torch.randint(4, vocab, (size, length + 1), device=device)
    if kind is DecoderLM:
        return {"tokens": tokens[:, :-1], "targets": tokens[:, 1:], "mask": None}
    return {
        "src": tokens[:, :-1],
        "src_mask": None,
        "tgt_in": tokens[:, :-1],
        "tgt_out": tokens[:, 1:],
        "tgt_mask": None,
    }


def measure(name: str, length: int, args) -> dict:
    kind, shape = MODELS[name]
    shape = {**shape, **(TINY if args.tiny else {})}
    device = torch.device(args.device)
    model = kind(ModelConfig(**shape, max_len=max(args.lengths), dropout=0.1)).to(device).train()
    if args.compile:
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    size = max(1, args.tokens // length)
    batch = make_batch(kind, size, length, shape["vocab_size"], device)
    gpu = device.type == "cuda"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if gpu else contextlib.nullcontext()
    flash = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if gpu else contextlib.nullcontext()

    def step():
        with autocast, flash:
            logits, targets = model.forward_batch(batch)
            loss = sequence_loss(logits.float(), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if gpu:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    peak = peak_flops(device, "bf16-mixed")
    flops = model.step_flops(batch)
    return {
        "model": name,
        "length": length,
        "batch": size,
        "tokens_per_step": size * length,
        "step_ms": round(seconds * 1e3, 2),
        "tokens_per_s": round(size * length / seconds),
        "mfu": round(flops / seconds / peak, 4) if peak else None,
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if gpu else None,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--lengths", nargs="+", type=int, default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--tokens", type=int, default=32768, help="tokens per step (batch = tokens / length)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (as model.compile=true)")
    parser.add_argument("--tiny", action="store_true", help="a small model: checks the script, measures nothing")
    parser.add_argument("--out", help="write the rows as JSON here too")
    args = parser.parse_args()

    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device={where} torch={torch.__version__} tokens/step={args.tokens} compile={args.compile}")
    rows = []
    for name in args.models:
        for length in args.lengths:
            try:
                row = measure(name, length, args)
            except torch.OutOfMemoryError:
                row = {"model": name, "length": length, "error": "out of memory"}
                torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"device": where, "torch": torch.__version__, "args": vars(args), "rows": rows}, file, indent=2)


if __name__ == "__main__":
    main()
