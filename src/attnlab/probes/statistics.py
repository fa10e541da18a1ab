"""What the probes measure in one attention layer, from its recorded logits and weights.

With weights a = softmax(s) over the keys a query can see:

* entropy      H = −Σ_j a_j log a_j in nats (≤ log n_visible); also ÷ log n_visible
* saturation   the fraction of query rows whose largest weight exceeds 0.99
* softmax_jac  Σ_j a_j (1 − a_j): the diagonal of ∂a/∂s, near 0 when the softmax saturates
* logit std / max of the scaled logits s = score / τ over visible entries
* grad/logits  the RMS of ∂loss/∂s over visible entries, from the training backward, and
               the median over query rows of the row's gradient norm ‖∂loss/∂s_i·‖. The
               two differ by orders of magnitude when the softmax saturates: most rows
               then get almost no gradient while the few near-tie rows get large ones,
               and the RMS follows those few (see tests/test_probes.py).

Padded queries and keys are left out. Rows are processed in chunks of queries, so the
temporaries stay bounded however long the sequence is.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SATURATED = 0.99


def attention_entropy(weights: Tensor) -> Tensor:
    """(..., n, m) attention weights → (..., n) entropy in nats of each query row.

    Masked keys carry weight 0 and contribute 0 (0 · log 0 = 0).
    """
    return -torch.special.xlogy(weights, weights).sum(dim=-1)


def layer_statistics(
    weights: Tensor,
    logits: Tensor,
    logits_grad: Tensor | None = None,
    visible: Tensor | None = None,
    chunk_size: int = 256,
) -> dict[str, Tensor]:
    """Statistics of one layer's (B, h, n, m) weights and logits; see the module doc.

    visible: bool, broadcastable to (B, h, n, m), True = key j visible to query i; a
    row with no visible key (a padded query) is left out. None = all visible.
    Returns scalars, and ``entropy_per_head`` of shape (h,).
    """
    batch, heads, n, m = weights.shape
    visible_all = None if visible is None else visible.expand(batch, heads, n, m)
    zeros = torch.zeros(heads, dtype=torch.float64, device=weights.device)
    entropy, rows, normalised, normalised_rows = zeros.clone(), zeros.clone(), zeros.clone(), zeros.clone()
    jacobian = saturated = logit_sum = logit_sq = entries = grad_sq = 0.0
    logit_max = -math.inf
    row_grad_norms = []

    with torch.no_grad():
        for start in range(0, n, chunk_size):
            rows_slice = slice(start, min(n, start + chunk_size))
            a = weights[:, :, rows_slice].double()
            s = logits[:, :, rows_slice].double()
            visible = torch.ones_like(a, dtype=torch.bool) if visible_all is None else visible_all[:, :, rows_slice]
            valid = visible.any(dim=-1)  # (B, h, c): a real query with at least one visible key

            row_entropy = attention_entropy(a)
            entropy += (row_entropy * valid).sum(dim=(0, 2))
            rows += valid.sum(dim=(0, 2))
            n_visible = visible.sum(dim=-1)
            comparable = valid & (n_visible > 1)  # one visible key: entropy 0 of log 1
            normalised += (row_entropy / n_visible.clamp(min=2).log() * comparable).sum(dim=(0, 2))
            normalised_rows += comparable.sum(dim=(0, 2))
            jacobian += ((a * (1 - a)).sum(dim=-1) * valid).sum().item()
            saturated += ((a.max(dim=-1).values > SATURATED) & valid).sum().item()

            visible_logits = s[visible]
            if visible_logits.numel():
                logit_sum += visible_logits.sum().item()
                logit_sq += visible_logits.square().sum().item()
                entries += visible_logits.numel()
                logit_max = max(logit_max, visible_logits.max().item())
            if logits_grad is not None:
                grad = logits_grad[:, :, rows_slice].double() * visible
                grad_sq += grad.square().sum().item()
                row_grad_norms.append(grad.norm(dim=-1)[valid])

    total_rows = rows.sum().item()
    mean = logit_sum / max(entries, 1)
    stats = {
        "entropy": entropy.sum() / max(total_rows, 1),
        "entropy_per_head": entropy / rows.clamp(min=1),
        "entropy_norm": normalised.sum() / normalised_rows.sum().clamp(min=1),
        "saturation": torch.tensor(saturated / max(total_rows, 1)),
        "softmax_jac": torch.tensor(jacobian / max(total_rows, 1)),
        "logit_std": torch.tensor(math.sqrt(max(logit_sq / max(entries, 1) - mean**2, 0.0))),
        "logit_max": torch.tensor(logit_max),
    }
    if logits_grad is not None:
        stats["grad_logits"] = torch.tensor(math.sqrt(grad_sq / max(entries, 1)))
        norms = torch.cat(row_grad_norms)
        stats["grad_logits_row_median"] = norms.median() if norms.numel() else torch.tensor(0.0)
    return {key: value.float() for key, value in stats.items()}
