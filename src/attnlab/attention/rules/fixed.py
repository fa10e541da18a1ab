"""The fixed divisors.

* ``none``    τ = 1: unscaled dot product; logits grow like √d_k.
* ``sqrt_dk`` τ = √d_k: Vaswani et al. 2017 §3.2.1; unit-variance logits at init.
* ``dk``      τ = d_k: μP (Yang et al. 2022, "Tensor Programs V"), which expects q and
  k to become correlated in training so that q·k grows like d_k.
"""

import math

from attnlab.attention.temperature import Fixed, register_temperature


@register_temperature("none")
class NoScale(Fixed):
    def __init__(self, d_k: int, n_heads: int):
        super().__init__(d_k, n_heads, 1.0)


@register_temperature("sqrt_dk")
class SqrtDk(Fixed):
    def __init__(self, d_k: int, n_heads: int):
        super().__init__(d_k, n_heads, math.sqrt(d_k))


@register_temperature("dk")
class Dk(Fixed):
    def __init__(self, d_k: int, n_heads: int):
        super().__init__(d_k, n_heads, float(d_k))
