"""``mup``: μP's attention multiplier (Yang et al. 2022, "Tensor Programs V"; the
``mup`` package's ``attn_mult / d`` with ``attn_mult = 8``): τ = d_k / √base_d_k.

τ grows like d_k, as ``dk``, but equals √d_k at the base width ``base_d_k`` (default
64, where mup's 8/d_k is 1/√64), so a model tuned at the base width starts out the same
and only wider or narrower ones differ. Pair it with ``attention.zero_query_init=true``
for mup's zero-initialised query projection.
"""

import math

from attnlab.attention.temperature import Fixed, register_temperature
from attnlab.checks import positive_int


@register_temperature("mup")
class MuP(Fixed):
    def __init__(self, d_k: int, n_heads: int, base_d_k: int = 64):
        positive_int("base_d_k", base_d_k)
        super().__init__(d_k, n_heads, d_k / math.sqrt(base_d_k))
        self.base_d_k = base_d_k

    def extra_repr(self) -> str:
        return f"tau={self.value:g} (d_k={self.d_k} / sqrt(base_d_k={self.base_d_k}))"
