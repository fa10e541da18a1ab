"""Multi-head attention: project → weight → aggregate.

* project:   X → Q, K, V with h heads of size d_k (queries, keys) and d_v (values);
* weight:    a score function (the variant) divided by a temperature rule τ, the mask,
             then softmax — on SDPA (fast path) unless the weights are needed;
* aggregate: weights × V, heads concatenated, output projection W^O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor, nn

from attnlab.attention.functional import attend, attention, visibility
from attnlab.attention.registry import make_score
from attnlab.attention.temperature import make_temperature


@dataclass
class AttentionConfig:
    """What ``conf/attention/*.yaml`` holds: which variant, which τ, its options."""

    variant: str = "dot"
    scale: str | float = "sqrt_dk"
    tau_init: float | None = None  # learned τ only; None = √d_k
    tau_per_head: bool = True  # learned τ only; False = one τ per layer
    dropout: float = 0.0  # on the attention weights
    options: dict = field(default_factory=dict)  # passed to the variant's Score


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with h, d_k and d_v free.

    d_k defaults to d_model / h and d_v to d_k. ``forward(x, source=None, ...)`` attends
    from x to ``source`` (x itself when None). Set ``record = True`` to make the layer
    take the explicit path and keep, from its last call, ``logits`` (scaled, with
    retained grad), ``weights``, ``mask`` (which keys each query could see, or None)
    and ``query_mask`` (which queries are real tokens, or None), for probes; off, it
    costs nothing.
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
        if d_k is None:
            if d_model % n_heads:
                raise ValueError(
                    f"model.d_model={d_model} is not divisible by model.n_heads={n_heads}; "
                    "set model.d_k explicitly or pick n_heads dividing d_model"
                )
            d_k = d_model // n_heads
        d_v = d_v or d_k
        self.d_model, self.n_heads, self.d_k, self.d_v = d_model, n_heads, d_k, d_v
        self.name = name
        self.dropout = attn.dropout

        self.q_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.k_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, n_heads * d_v, bias=bias)
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=bias)
        self.score = make_score(attn.variant, d_k, n_heads, **attn.options)
        self.temperature = make_temperature(attn.scale, d_k, n_heads, init=attn.tau_init, per_head=attn.tau_per_head)
        self.record = False
        self.logits = self.weights = self.mask = self.query_mask = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # LeCun-normal projections: unit-variance inputs give unit-variance q and k
        # components whatever d_k is, so Var(q·k) = d_k at init, as SPEC §1 assumes.
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.normal_(proj.weight, std=1 / math.sqrt(proj.in_features))
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

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
        query_mask: Tensor | None = None,
    ) -> Tensor:
        """x: (B, n, d_model); source: (B, m, d_model) or None for self-attention.

        key_mask: (B, m) bool, True = a real key (False = padding, never attended).
        attn_mask: bool, broadcastable to (B, h, n, m), True = may attend.
        query_mask: (B, n) bool, True = a real query; only recorded, for the probes.
        """
        source = x if source is None else source
        q = self.split_heads(self.q_proj(x), self.d_k)
        k = self.split_heads(self.k_proj(source), self.d_k)
        v = self.split_heads(self.v_proj(source), self.d_v)

        mask = attn_mask
        if key_mask is not None:
            key_mask = key_mask[:, None, None, :]
            mask = key_mask if mask is None else mask & key_mask
        tau = self.temperature()
        dropout_p = self.dropout if self.training else 0.0

        if self.score.fused and not self.record:
            q, k = self.score.prepare(q, k)
            out, _ = attention(q, k, v, tau, mask=mask, causal=causal, dropout_p=dropout_p)
        else:
            logits = self.score(q, k) / tau
            if self.record:
                if logits.requires_grad:
                    logits.retain_grad()
                self.logits = logits
            mask = visibility(mask, causal, q.shape[-2], k.shape[-2], q.device)
            out, weights = attend(logits, v, mask, dropout_p)
            if self.record:
                self.weights, self.mask, self.query_mask = weights, mask, query_mask

        batch, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, length, self.n_heads * self.d_v)
        return self.out_proj(out)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, n_heads={self.n_heads}, d_k={self.d_k}, d_v={self.d_v}"
