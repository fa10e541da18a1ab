"""Optimiser parameter groups: what weight decay applies to."""

from __future__ import annotations

from torch import nn

from attnlab.attention import Temperature

# Parameters of these modules are scales or lookup rows, not weight matrices: decaying
# them towards 0 would bias the model (a learned τ decayed to 0 means hard argmax).
NO_DECAY_MODULES = (Temperature, nn.LayerNorm, nn.Embedding)


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
