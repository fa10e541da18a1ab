"""The Transformer of Vaswani et al. 2017 and a decoder-only LM, from the same blocks.

Post-LN by default, as in the paper (x = LN(x + sublayer(x))); ``pre_norm=True`` gives
the pre-LN arrangement (x = x + sublayer(LN(x)), final LN) that trains more stably
deep or with large learning rates. Attention layers are named for the probes:
``enc.L<l>``, ``dec.self.L<l>``, ``dec.cross.L<l>`` and, in the LM, ``L<l>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention import AttentionConfig, MultiHeadAttention
from attnlab.attention.multihead import default_d_k
from attnlab.checks import positive_int, probability
from attnlab.decoding import beam_search, greedy
from attnlab.perf import flop_shape, step_flops


@dataclass
class ModelConfig:
    """What ``conf/model/*.yaml`` holds. d_k defaults to d_model / n_heads, d_v to d_k."""

    vocab_size: int = 64
    d_model: int = 64
    n_heads: int = 4
    d_k: int | None = None
    d_v: int | None = None
    d_ff: int = 256
    n_layers: int = 2  # each of encoder and decoder
    dropout: float = 0.1
    max_len: int = 512
    positions: str = "sinusoidal"  # or "none": no position information (a position-free task)
    pre_norm: bool = False
    tie_embeddings: bool = True  # share input embeddings and the output projection
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            positive_int(name, getattr(self, name))
        for name in ("d_k", "d_v"):
            positive_int(name, getattr(self, name), allow_none=True)
        probability("dropout", self.dropout)
        if self.positions not in ("sinusoidal", "none"):
            raise ValueError(f"positions={self.positions!r} is not valid; accepted values: sinusoidal, none")
        if self.d_k is None:
            default_d_k(self.d_model, self.n_heads)


def sinusoidal_positions(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)  (§3.5)."""
    position = torch.arange(max_len).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)[:, : d_model // 2]
    return table


class Embedding(nn.Module):
    """Token embedding × √d_model plus sinusoidal positions (unless ``positions=none``), then dropout (§3.4, §3.5)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.tokens.weight, std=cfg.d_model**-0.5)
        self.register_buffer("positions", sinusoidal_positions(cfg.max_len, cfg.d_model), persistent=False)
        self.scale = math.sqrt(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.add_positions = cfg.positions == "sinusoidal"

    def forward(self, tokens: Tensor, start: int = 0) -> Tensor:
        """tokens at positions start, start + 1, … (start > 0 when decoding one token at a time)."""
        end = start + tokens.shape[1]
        if end > self.positions.shape[0]:
            raise ValueError(f"sequence length {end} exceeds model.max_len={self.positions.shape[0]}")
        embedded = self.tokens(tokens) * self.scale
        return self.dropout(embedded + self.positions[start:end] if self.add_positions else embedded)


class FeedForward(nn.Sequential):
    """FFN(x) = max(0, x W1 + b1) W2 + b2  (§3.3)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model))


class Block(nn.Module):
    """Self-attention, optional cross-attention, feed-forward; each in a residual."""

    def __init__(self, cfg: ModelConfig, prefix: str, layer: int, cross: bool = False):
        super().__init__()
        self.pre_norm = cfg.pre_norm

        def mha(name: str) -> MultiHeadAttention:
            return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.d_k, cfg.d_v, cfg.attention, name=name)

        # A decoder with cross-attention names its two kinds apart: dec.self.L0, dec.cross.L0.
        self.self_attn = mha(f"{prefix}self.L{layer}" if cross else f"{prefix}L{layer}")
        self.cross_attn = mha(f"{prefix}cross.L{layer}") if cross else None
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        n_sublayers = 3 if cross else 2
        self.norms = nn.ModuleList(nn.LayerNorm(cfg.d_model) for _ in range(n_sublayers))
        self.dropout = nn.Dropout(cfg.dropout)

    def residual(self, x: Tensor, norm: nn.LayerNorm, sublayer) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: dict | None = None,
    ) -> Tensor:
        """mask / memory_mask: (B, n) / (B, m) bool, True = real token. cache: {"self": {}, "cross": {}}
        when decoding one token at a time (see MultiHeadAttention)."""
        cache = cache or {}
        self_attn = partial(self.self_attn, key_mask=mask, causal=causal, cache=cache.get("self"))
        x = self.residual(x, self.norms[0], self_attn)
        if self.cross_attn is not None:
            # A padded query attends to nothing (output 0), so probes can tell it is padding.
            padded_queries = None if mask is None else mask[:, None, :, None]
            cross_attn = partial(
                self.cross_attn, source=memory, key_mask=memory_mask, attn_mask=padded_queries, cache=cache.get("cross")
            )
            x = self.residual(x, self.norms[1], cross_attn)
        return self.residual(x, self.norms[-1], self.ffn)


class Stack(nn.Module):
    """N blocks, with the final LayerNorm a pre-LN stack needs."""

    def __init__(self, cfg: ModelConfig, prefix: str, cross: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(Block(cfg, prefix, layer, cross) for layer in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()

    def forward(self, x: Tensor, caches: list[dict] | None = None, **kwargs) -> Tensor:
        for layer, cache in zip(self.layers, caches or [None] * len(self.layers), strict=True):
            x = layer(x, cache=cache, **kwargs)
        return self.final_norm(x)


class OutputHead(nn.Module):
    """Pre-softmax linear map, optionally tied to the embedding (§3.4)."""

    def __init__(self, cfg: ModelConfig, embedding: Embedding):
        super().__init__()
        self.proj = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.proj.weight = embedding.tokens.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


class Transformer(nn.Module):
    """Encoder–decoder Transformer over one shared (source + target) vocabulary."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.encoder = Stack(cfg, "enc.")
        self.decoder = Stack(cfg, "dec.", cross=True)
        self.head = OutputHead(cfg, self.embed)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.encoder(self.embed(src), mask=src_mask)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None):
        hidden = self.decoder(self.embed(tgt), mask=tgt_mask, causal=True, memory=memory, memory_mask=src_mask)
        return self.head(hidden)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None):
        """src: (B, m), tgt: (B, n) token ids (tgt starts with BOS); returns (B, n, vocab) logits."""
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)

    def forward_batch(self, batch: dict) -> tuple[Tensor, Tensor]:
        """(logits, targets) of a seq2seq batch; targets are -100 where nothing is scored."""
        return self(batch["src"], batch["tgt_in"], batch["src_mask"], batch["tgt_mask"]), batch["tgt_out"]

    def step_flops(self, batch: dict) -> float:
        """Training FLOPs of a step on this batch's padded shapes (the work the device does)."""
        (size, m), n = batch["src"].shape, batch["tgt_in"].shape[1]
        pairs = {"enc": size * m * m, "dec.self": size * n * n, "dec.cross": size * n * m}
        per_layer = {name: pairs[name.rsplit(".L", 1)[0]] for name in flop_shape(self)[1]}
        return step_flops(self, size * (m + n), per_layer)

    @torch.no_grad()
    def generate(
        self,
        src: Tensor,
        src_mask: Tensor | None,
        bos: int,
        eos: int,
        beam: int = 1,
        alpha: float = 0.6,
        extra_length: int = 50,
    ) -> Tensor:
        """Translations of ``src``: greedy (beam = 1) or beam search with GNMT's length penalty α,
        at most (input length + ``extra_length``) tokens each (§6.1). Returns (B, L) ids
        without BOS, EOS-padded after each sentence's end."""
        if src_mask is None:
            src_mask = torch.ones_like(src, dtype=torch.bool)
        max_lengths = (src_mask.sum(1) + extra_length).clamp(max=self.cfg.max_len - 1)
        memory = self.encode(src, src_mask)
        if beam > 1:  # each sentence's memory once per hypothesis, sentence-major
            memory, src_mask = memory.repeat_interleave(beam, 0), src_mask.repeat_interleave(beam, 0)
        next_log_probs = self.next_token_scorer(memory, src_mask)
        if beam == 1:
            return greedy(next_log_probs, bos, eos, max_lengths)
        return beam_search(next_log_probs, bos, eos, max_lengths, beam, alpha)[0]

    def next_token_scorer(self, memory: Tensor, src_mask: Tensor | None):
        """``next_log_probs(tokens, order)`` for attnlab.decoding: the decoder keeps every layer's
        keys and values, so each call runs the newest position only."""
        caches = [{"self": {}, "cross": {}} for _ in self.decoder.layers]

        def next_log_probs(tokens: Tensor, order: Tensor | None) -> Tensor:
            if order is not None:  # beam search moved hypotheses: their past keys move with them
                for cache in caches:  # (cross-attention's memory is the same for a sentence's hypotheses)
                    cache["self"] = {name: cached.index_select(0, order) for name, cached in cache["self"].items()}
            position = tokens.shape[1] - 1
            hidden = self.decoder(
                self.embed(tokens[:, -1:], start=position), memory=memory, memory_mask=src_mask, caches=caches
            )
            return self.head(hidden[:, -1]).log_softmax(-1)

        return next_log_probs


class DecoderLM(nn.Module):
    """Decoder-only causal language model: embedding, N causal self-attention blocks, head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.decoder = Stack(cfg, "")
        self.head = OutputHead(cfg, self.embed)

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens: (B, n) ids, mask: (B, n) True = real token; returns (B, n, vocab) logits."""
        return self.head(self.decoder(self.embed(tokens), mask=mask, causal=True))

    def forward_batch(self, batch: dict) -> tuple[Tensor, Tensor]:
        """(logits, targets) of a language-model batch; targets are -100 where nothing is scored."""
        return self(batch["tokens"], batch["mask"]), batch["targets"]

    def step_flops(self, batch: dict) -> float:
        """Training FLOPs of a step on this batch's padded shapes."""
        size, n = batch["tokens"].shape
        return step_flops(self, size * n, dict.fromkeys(flop_shape(self)[1], size * n * n))


def attention_layers(model: nn.Module) -> list[MultiHeadAttention]:
    """Every attention layer of a model, in module order (named as in this module's doc)."""
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def sequence_loss(logits: Tensor, targets: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0):
    return F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index, label_smoothing=label_smoothing
    )
