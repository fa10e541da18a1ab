"""Optimisers and learning-rate schedules: what ``conf/optim/*.yaml`` selects.

``OPTIMIZERS`` and ``SCHEDULES`` are the accepted values of ``optim.name`` and
``optim.schedule``; the config checks read them from here.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.attention import Temperature

# Parameters of these modules are scales or lookup rows, not weight matrices: decaying
# them towards 0 would bias the model (a learned τ decayed to 0 means hard argmax).
NO_DECAY_MODULES = (Temperature, nn.LayerNorm, nn.Embedding)

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def inverse_sqrt(warmup: int, total: int, d_model: int):
    """Linear warm-up to the peak ``optim.lr``, then ∝ 1/√step (the shape of Vaswani et al. §5.3)."""
    return lambda step: min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))


def vaswani(warmup: int, total: int, d_model: int):
    """Vaswani et al. §5.3, eq. 3, as written: lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5),
    step counted from 1. ``optim.lr`` multiplies it (1.0 = the paper)."""
    return lambda step: d_model**-0.5 * min((step + 1) ** -0.5, (step + 1) * warmup**-1.5)


def cosine(warmup: int, total: int, d_model: int):
    def multiplier(step):
        step += 1
        if step < warmup:
            return step / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


def constant(warmup: int, total: int, d_model: int):
    return lambda step: 1.0


# Each maps (warmup, total steps, d_model) to the multiplier of optim.lr at optimizer step ``step`` (0-based).
SCHEDULES = {"inverse_sqrt": inverse_sqrt, "vaswani": vaswani, "cosine": cosine, "constant": constant}


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices decayed; biases, norms, embeddings and τ not."""
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))  # a tied weight is counted once, with its first owner
            if isinstance(module, NO_DECAY_MODULES) or name.endswith("bias"):
                no_decay.append(param)
            else:
                decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, optim: dict, total_steps: int):
    """Adam or AdamW over attnlab's parameter groups, with a per-step LambdaLR schedule."""
    optimizer = OPTIMIZERS[optim["name"]](
        param_groups(model, optim["weight_decay"]),
        lr=optim["lr"],
        betas=tuple(optim["betas"]),
        eps=optim["eps"],
    )
    d_model = getattr(getattr(model, "cfg", None), "d_model", 1)
    multiplier = SCHEDULES[optim["schedule"]](optim["warmup_steps"], total_steps, d_model)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
