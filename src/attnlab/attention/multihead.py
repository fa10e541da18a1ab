"""Multi-head attention: project → weight → aggregate.

* project:   X → Q, K, V with h heads of size d_k (queries, keys) and d_v (values);
* weight:    a score function (the variant) divided by a temperature rule τ, an
             optional soft cap, the mask, then softmax — on SDPA (fast path) unless
             the weights are needed or the cap is on;
* aggregate: weights × V, heads concatenated, output projection W^O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.functional import attend, check_mask, fast_attention, key_counts, visibility
from attnlab.attention.registry import make_score, variant_class
from attnlab.attention.temperature import make_temperature, parse_rule
from attnlab.checks import positive_int, positive_number, probability


@dataclass
class AttentionConfig:
    """What ``conf/attention/*.yaml`` holds: which variant, which τ rule, their options."""

    variant: str = "dot"
    scale: Any = "sqrt_dk"  # a rule name (a key of TEMPERATURES) or a fixed divisor (a number)
    # Options per rule name, {rule: {option: value}}; only the entry of the rule in `scale`
    # is used, so a sweep over rules carries each one's options.
    scale_options: dict = field(default_factory=dict)
    softcap: float | None = None  # c: logits → c·tanh(logits / c) after τ (Gemma 2 uses 50)
    zero_query_init: bool = False  # W_Q starts at 0 (μP, as the mup package advises)
    dropout: float = 0.0  # on the attention weights
    options: dict = field(default_factory=dict)  # passed to the variant's Score

    def __post_init__(self):
        variant_class(self.variant)
        parse_rule(self.scale)
        positive_number("softcap", self.softcap, allow_none=True)
        probability("dropout", self.dropout)
        make_temperature(self.scale, 1, 1, **self.rule_options())  # a bad option fails here, not mid-build

    def rule_options(self) -> dict:
        """The options of the rule in ``scale`` (none for a fixed number)."""
        options = self.scale_options.get(str(self.scale)) if isinstance(self.scale, str) else None
        return dict(options or {})


def default_d_k(d_model: int, n_heads: int) -> int:
    """d_model / n_heads, when it divides; else an error saying what to set."""
    if d_model % n_heads:
        divisors = [h for h in range(1, d_model + 1) if d_model % h == 0]
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}, so d_k cannot default to "
            f"d_model / n_heads; set d_k=<size> explicitly or use n_heads in {divisors}"
        )
    return d_model // n_heads


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with h, d_k and d_v free.

    d_k defaults to d_model / h and d_v to d_k. ``forward(x, source=None, ...)`` attends
    from x to ``source`` (x itself when None). ``record`` is None, or a record a probe
    installed (``attnlab.probes.record``): while one is there the layer takes the
    explicit path and fills it with its logits, weights and visibility; with none it
    keeps nothing and costs nothing.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_k: int | None = None,
        d_v: int | None = None,
        attn: AttentionConfig | None = None,
        bias: bool = True,
        name: str = "",
    ):
        super().__init__()
        attn = attn or AttentionConfig()
        positive_int("d_model", d_model)
        positive_int("n_heads", n_heads)
        positive_int("d_k", d_k, allow_none=True)
        positive_int("d_v", d_v, allow_none=True)
        d_k = default_d_k(d_model, n_heads) if d_k is None else d_k
        d_v = d_k if d_v is None else d_v
        self.d_model, self.n_heads, self.d_k, self.d_v = d_model, n_heads, d_k, d_v
        self.name = name
        self.dropout = attn.dropout
        self.softcap = attn.softcap
        self.zero_query_init = attn.zero_query_init

        self.q_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.k_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, n_heads * d_v, bias=bias)
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=bias)
        self.score = make_score(attn.variant, d_k, n_heads, **attn.options)
        self.temperature = make_temperature(attn.scale, d_k, n_heads, **attn.rule_options())
        self.record = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # LeCun-normal projections: unit-variance inputs give unit-variance q and k
        # components whatever d_k is, so Var(q·k) = d_k at init, the premise of
        # dividing by √d_k (Vaswani et al. 2017 §3.2.1).
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.normal_(proj.weight, std=1 / math.sqrt(proj.in_features))
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        if self.zero_query_init:
            # μP: all logits 0 at init, whatever the width; W_Q still gets a gradient (from k).
            nn.init.zeros_(self.q_proj.weight)

    def split_heads(self, x: Tensor, d_head: int) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, d_head).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        source: Tensor | None = None,
        key_mask: Tensor | None = None,
        causal: bool = False,
        attn_mask: Tensor | None = None,
        cache: dict | None = None,
    ) -> Tensor:
        """x: (B, n, d_model); source: (B, m, d_model) or None for self-attention.

        key_mask: (B, m) bool, True = a real key (False = padding, never attended).
        attn_mask: bool, broadcastable to (B, h, n, m), True = may attend.
        cache: a dict this layer keeps its keys and values in, for decoding one token at a
        time: self-attention appends the new position's (x is then that one position, which
        sees every key so far); cross-attention projects ``source`` once.
        """
        self_attention = source is None
        source = x if self_attention else source
        self.check_inputs(x, source, key_mask, attn_mask)
        k, v = self.keys_and_values(source, cache, self_attention)
        causal = causal and cache is None
        mask = attn_mask
        if key_mask is not None:
            key_mask = key_mask[:, None, None, :]
            mask = key_mask if mask is None else mask & key_mask
        n_keys = None
        if self.temperature.uses_keys:
            n_keys = key_counts(mask, causal, x.shape[1], k.shape[-2], x.device)
        tau = self.temperature(n_keys)

        fast = self.score.fused and self.record is None and self.softcap is None
        if fast and self.score.linear and isinstance(tau, Tensor) and tau.dim() <= 3 and tau.shape[-2:] in ((), (1, 1)):
            # A τ per head (or per layer) divides W_Q's h·d_k rows, not all B·n·h·d_k entries
            # of q: the same q/τ, nearly free (SDPA's own scale takes only a constant).
            q, tau = self.split_heads(self.project_scaled(x, tau), self.d_k), 1.0
        else:
            q = self.split_heads(self.q_proj(x), self.d_k)
        dropout_p = self.dropout if self.training else 0.0

        if fast:
            q, k = self.score.prepare(q, k)
            out = fast_attention(q, k, v, tau, mask, causal, dropout_p)
        elif self.record is None:
            out, *_ = self.weigh(q, k, v, tau, mask, causal, dropout_p)
        else:
            # A padded key of self-attention is a padded query too: its row is marked unseen.
            queries = key_mask.transpose(-1, -2) if self_attention and key_mask is not None else None
            out = self.weigh_and_record(q, k, v, tau, mask, causal, dropout_p, queries)

        batch, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, length, self.n_heads * self.d_v)
        return self.out_proj(out)

    def keys_and_values(self, source: Tensor, cache: dict | None, self_attention: bool) -> tuple[Tensor, Tensor]:
        if cache is not None and not self_attention and "k" in cache:
            return cache["k"], cache["v"]  # the encoder's memory does not change while decoding
        k = self.split_heads(self.k_proj(source), self.d_k)
        v = self.split_heads(self.v_proj(source), self.d_v)
        if cache is not None:
            if self_attention and "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        return k, v

    def weigh(self, q: Tensor, k: Tensor, v: Tensor, tau, mask: Tensor | None, causal: bool, dropout_p: float):
        """The explicit path: logits = score / τ (soft-capped if asked) and their softmax, materialised."""
        logits = self.score(q, k) / tau
        if self.softcap is not None:
            # Gemma 2 (Gemma Team 2024): c·tanh(logits / c) keeps every logit in (−c, c).
            logits = self.softcap * torch.tanh(logits / self.softcap)
        mask = visibility(mask, causal, q.shape[-2], k.shape[-2], q.device)
        out, weights = attend(logits, v, mask, dropout_p)
        return out, logits, weights, mask

    # Under torch.compile a probe step runs this part eagerly: retaining a gradient and
    # filling a Python object are what compiled graphs cannot do.
    @torch.compiler.disable
    def weigh_and_record(self, q, k, v, tau, mask, causal, dropout_p, real_queries: Tensor | None) -> Tensor:
        out, logits, weights, visible = self.weigh(q, k, v, tau, mask, causal, dropout_p)
        if real_queries is not None:
            visible = visible & real_queries
        self.record.keep(logits, weights, visible)
        return out

    def project_scaled(self, x: Tensor, tau: Tensor) -> Tensor:
        """x W_Qᵀ / τ with τ (one per head, (h, 1, 1), or one for the layer) on W_Q's rows."""
        per_row = tau.reshape(-1, 1).expand(self.n_heads, self.d_k).reshape(-1, 1)
        bias = self.q_proj.bias / per_row[:, 0] if self.q_proj.bias is not None else None
        return F.linear(x, self.q_proj.weight / per_row, bias)

    def check_inputs(self, x: Tensor, source: Tensor, key_mask: Tensor | None, attn_mask: Tensor | None) -> None:
        for name, tensor in (("x", x), ("source", source)):
            if tensor.dim() != 3 or tensor.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must have shape (batch, length, d_model={self.d_model}); got {tuple(tensor.shape)}"
                )
        if source.shape[0] != x.shape[0]:
            raise ValueError(f"x and source must share the batch size; got {tuple(x.shape)} and {tuple(source.shape)}")
        if key_mask is not None:
            expected = (source.shape[0], source.shape[1])
            if key_mask.dtype != torch.bool or tuple(key_mask.shape) != expected:
                raise ValueError(
                    f"key_mask must be a bool tensor of shape (batch, keys) = {expected} (True = a real key); "
                    f"got {key_mask.dtype} {tuple(key_mask.shape)}"
                )
        if attn_mask is not None:
            check_mask(attn_mask, (x.shape[0], self.n_heads, x.shape[1], source.shape[1]), "attn_mask")

    def extra_repr(self) -> str:
        cap = f", softcap={self.softcap:g}" if self.softcap is not None else ""
        return f"name={self.name!r}, n_heads={self.n_heads}, d_k={self.d_k}, d_v={self.d_v}{cap}"
