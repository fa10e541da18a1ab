"""Attention as project → weight → aggregate (see multihead.py), with τ rules and variants."""

from attnlab.attention.functional import attend, attention, fast_attention, key_counts, visibility
from attnlab.attention.multihead import AttentionConfig, MultiHeadAttention
from attnlab.attention.registry import VARIANTS, Score, load_variants, make_score, register_variant, variant_class
from attnlab.attention.temperature import (
    TEMPERATURES,
    Fixed,
    Temperature,
    load_rules,
    make_temperature,
    parse_rule,
    register_temperature,
    rule_options,
    tau_values,
)

load_variants()
load_rules()

__all__ = [
    "TEMPERATURES",
    "VARIANTS",
    "AttentionConfig",
    "Fixed",
    "MultiHeadAttention",
    "Score",
    "Temperature",
    "attend",
    "attention",
    "fast_attention",
    "key_counts",
    "make_score",
    "make_temperature",
    "parse_rule",
    "register_temperature",
    "register_variant",
    "rule_options",
    "tau_values",
    "variant_class",
    "visibility",
]
