"""A temperature rule written the way a user writes one, in a module of their own.

Nothing else in the project names it: the contract suite (test_variants_contract.py)
checks it because it is registered, and the CLI runs it with
``attnlab-train imports=[user_rule] attention.scale=sqrt_length`` (test_train.py).
"""

import math

import torch
from torch import nn

from attnlab.attention import Temperature, register_temperature


@register_temperature("sqrt_length")
class SqrtLength(Temperature):
    """τ = g · √d_k · √(n / base): softer for rows that see more keys, g learned per head."""

    uses_keys = True

    def __init__(self, d_k: int, n_heads: int, base: float = 8.0):
        super().__init__(d_k, n_heads)
        self.base = base
        self.log_gain = nn.Parameter(torch.zeros(n_heads, 1, 1))

    def forward(self, n_keys=None):
        return self.log_gain.exp() * math.sqrt(self.d_k) * (n_keys / self.base).sqrt()

    def logged(self):
        return {"gain": self.log_gain.detach().exp().flatten()}
