"""``log_n``: logits scaled by log n, n the keys a query may see, on top of √d_k:
τ = √d_k / log n (Chiang & Cholak 2022, "Overcoming a theoretical limitation of
self-attention").

Without it, a fixed logit gap buys less and less weight as n grows and attention
fades to uniform; multiplying by log n keeps a query's focus as sequences get longer.
A row with a single visible key has weight 1 whatever τ is; log 1 = 0 would make τ
infinite there, so n is taken as at least 2.
"""

import math

from torch import Tensor

from attnlab.attention.temperature import Temperature, register_temperature


@register_temperature("log_n")
class LogN(Temperature):
    uses_keys = True

    def forward(self, n_keys: Tensor | None = None) -> Tensor:
        if n_keys is None:
            raise ValueError("the log_n rule needs n_keys, the number of keys each query row may see")
        return math.sqrt(self.d_k) / n_keys.clamp(min=2).log()
