"""Models built from one set of blocks: the encoder–decoder Transformer and a decoder-only LM."""

from attnlab.models.transformer import (
    Block,
    DecoderLM,
    ModelConfig,
    Transformer,
    attention_layers,
    sequence_loss,
    sinusoidal_positions,
)

__all__ = [
    "Block",
    "DecoderLM",
    "ModelConfig",
    "Transformer",
    "attention_layers",
    "sequence_loss",
    "sinusoidal_positions",
]
