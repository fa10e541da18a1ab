"""``learned``: τ = exp(log τ), per head or per layer, initialised at √d_k unless told
otherwise; cf. QK-norm's learned scale g = 1/τ (Henry et al. 2020, "Query-Key
Normalization for Transformers"). Options: ``init`` (null = √d_k), ``per_head``.
"""

import math

import torch
from torch import Tensor, nn

from attnlab.attention.temperature import Temperature, register_temperature
from attnlab.checks import positive_number


@register_temperature("learned")
class Learned(Temperature):
    """τ = exp(log_tau): positive by construction, multiplicative steps in log space."""

    def __init__(self, d_k: int, n_heads: int, init: float | None = None, per_head: bool = True):
        super().__init__(d_k, n_heads)
        positive_number("init", init, allow_none=True)
        init = math.sqrt(d_k) if init is None else float(init)
        shape = (n_heads, 1, 1) if per_head else (1, 1, 1)
        self.log_tau = nn.Parameter(torch.full(shape, math.log(init)))

    def forward(self, n_keys: Tensor | None = None) -> Tensor:
        return self.log_tau.exp()
