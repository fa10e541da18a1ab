"""``ssmax``: Scalable-Softmax (Nakanishi 2025, "Scalable-Softmax Is Superior for
Attention"): softmax(s · log n · z) with z = q·k/√d_k, n the keys a query may see and
s learned per head (or per layer): τ = √d_k / (s · log n).

Options: ``init`` — s at the start; null = 1 / log(base_length), which makes the rule
equal ``sqrt_dk`` at sequences of ``base_length`` keys (default 32, the synthetic
tasks' length), so runs compared at the training length start the same. ``per_head``.
As for ``log_n``, n is taken as at least 2 (a single key has weight 1 anyway).
"""

import math

import torch
from torch import Tensor, nn

from attnlab.attention.temperature import Temperature, per_head, register_temperature
from attnlab.checks import positive_int, positive_number


@register_temperature("ssmax")
class ScalableSoftmax(Temperature):
    uses_keys = True

    def __init__(self, d_k: int, n_heads: int, init: float | None = None, base_length: int = 32, per_head: bool = True):
        super().__init__(d_k, n_heads)
        positive_number("init", init, allow_none=True)
        positive_int("base_length", base_length)
        if base_length < 2:
            raise ValueError(f"base_length={base_length} is not valid; it must be >= 2 (log 1 = 0)")
        init = 1 / math.log(base_length) if init is None else float(init)
        self.s = nn.Parameter(torch.full((n_heads, 1, 1) if per_head else (1, 1, 1), init))

    def forward(self, n_keys: Tensor | None = None) -> Tensor:
        if n_keys is None:
            raise ValueError("the ssmax rule needs n_keys, the number of keys each query row may see")
        return math.sqrt(self.d_k) / (self.s * n_keys.clamp(min=2).log())

    def logged(self) -> dict[str, Tensor]:
        return {"ssmax_s": per_head(self.s, self.n_heads)}
