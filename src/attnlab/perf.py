"""Throughput accounting: model FLOPs per training step and the device's peak, for perf/mfu.

FLOPs of one training step (forward + backward ≈ 3 × forward; Kaplan et al. 2020, PaLM
appendix B): 6 FLOPs per weight of every matrix multiply per token, plus, per attention
layer, 6·h·(d_k + d_v) per (query, key) pair for QKᵀ and the weighted sum of V. MFU is
the achieved rate over the device's dense peak for the run's precision, where known.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.attention import MultiHeadAttention

# Dense peak FLOP/s by device name fragment: (bf16/fp16, tf32). Vendor datasheets.
PEAK_FLOPS = {
    "H200": (989.4e12, 494.7e12),
    "H100": (989.4e12, 494.7e12),  # SXM
    "A100": (312e12, 156e12),
    "L40S": (362.05e12, 183e12),
    "A10G": (70e12, 35e12),
}


def peak_flops(device: torch.device, precision: str) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, (half, tf32) in PEAK_FLOPS.items():
        if fragment in name:
            return half if "16" in str(precision) else tf32
    return None


def matmul_weights(model: nn.Module) -> int:
    """Weights that multiply every token: all Linear layers (the tied output head included)."""
    return sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))


def step_flops(model: nn.Module, tokens: int, pairs: dict[str, int]) -> float:
    """Training FLOPs of one step: ``tokens`` through the matmuls, ``pairs[layer name]``
    (query, key) pairs through each attention layer."""
    flops = 6 * matmul_weights(model) * tokens
    for layer in model.modules():
        if isinstance(layer, MultiHeadAttention):
            flops += 6 * layer.n_heads * (layer.d_k + layer.d_v) * pairs[layer.name]
    return flops
