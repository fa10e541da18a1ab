"""Cosine scores, the score half of QK-norm (Henry et al. 2020, "Query-Key Normalization
for Transformers"): q and k are L2-normalised along d_k, so q·k = cos(q, k) ∈ [-1, 1]
whatever d_k is. The paper's learned scale g is the inverse of a learned temperature,
so QK-norm is this score with ``attention.scale=learned`` (conf/attention/cosine.yaml).
Still a dot product of transformed q and k, hence fused.
"""

import torch.nn.functional as F

from attnlab.attention.registry import Score, register_variant


@register_variant("cosine")
class CosineScore(Score):
    fused = True

    def prepare(self, q, k):
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1)
