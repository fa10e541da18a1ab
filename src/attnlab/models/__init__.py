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

# The values model.kind accepts.
MODELS = {"transformer": Transformer, "lm": DecoderLM}

__all__ = [
    "MODELS",
    "Block",
    "DecoderLM",
    "ModelConfig",
    "Transformer",
    "attention_layers",
    "sequence_loss",
    "sinusoidal_positions",
]
