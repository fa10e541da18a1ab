"""Attention as project → weight → aggregate (see multihead.py), with τ rules and variants."""

from attnlab.attention.functional import attend, attention, fast_attention, visibility
from attnlab.attention.multihead import AttentionConfig, MultiHeadAttention
from attnlab.attention.registry import VARIANTS, Score, load_variants, make_score, register_variant, variant_class
from attnlab.attention.temperature import (
    TEMPERATURES,
    Learned,
    Temperature,
    make_temperature,
    parse_rule,
    tau_values,
)

load_variants()

__all__ = [
    "TEMPERATURES",
    "VARIANTS",
    "AttentionConfig",
    "Learned",
    "MultiHeadAttention",
    "Score",
    "Temperature",
    "attend",
    "attention",
    "fast_attention",
    "make_score",
    "make_temperature",
    "parse_rule",
    "register_variant",
    "tau_values",
    "variant_class",
    "visibility",
]
