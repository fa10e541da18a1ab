"""Dot-product scores q·k (Vaswani et al. 2017, §3.2.1). Fused: runs on SDPA."""

from attnlab.attention.registry import Score, register_variant


@register_variant("dot")
class DotScore(Score):
    fused = True
    linear = True  # q·k: q/τ = (x W_Q/τ)
