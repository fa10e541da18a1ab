"""Additive scores vᵀ tanh(W_q q + W_k k) (Bahdanau et al. 2015), per head.

The baseline of Vaswani et al. 2017 §3.2.1, who note that it beats *unscaled* dot
products for large d_k (cf. Britz et al. 2017). No fused form: the tanh is taken over
every (query, key) pair, so it always takes the explicit path and materialises a
(…, h, n, m, d_attn) tensor — keep sequences short.
"""

import math

import torch
from torch import nn

from attnlab.attention.registry import Score, register_variant


@register_variant("additive")
class AdditiveScore(Score):
    fused = False

    def __init__(self, d_k: int, n_heads: int, d_attn: int | None = None):
        super().__init__(d_k, n_heads)
        d_attn = d_attn or d_k
        bound = 1 / math.sqrt(d_k)
        self.w_q = nn.Parameter(torch.empty(n_heads, d_k, d_attn).uniform_(-bound, bound))
        self.w_k = nn.Parameter(torch.empty(n_heads, d_k, d_attn).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(n_heads, 1, d_attn))
        self.v = nn.Parameter(torch.empty(n_heads, d_attn, 1).uniform_(-1 / math.sqrt(d_attn), 1 / math.sqrt(d_attn)))

    def forward(self, q, k):
        # q: (..., h, n, d_k), k: (..., h, m, d_k); one set of weights per head.
        query_part = q @ self.w_q + self.bias  # (..., h, n, d_attn)
        key_part = k @ self.w_k  # (..., h, m, d_attn)
        hidden = torch.tanh(query_part.unsqueeze(-2) + key_part.unsqueeze(-3))
        return (hidden @ self.v.unsqueeze(-3)).squeeze(-1)  # (..., h, n, m)
