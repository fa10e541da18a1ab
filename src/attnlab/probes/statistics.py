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
# What each query row adds up, in the order layer_statistics stacks them.
ROW_SUMS = ("entropy", "normalised", "normalised_rows", "jacobian", "saturated", "rows", "entries",
            "logit_sum", "logit_sq", "grad_sq")  # fmt: skip


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
    everything = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=weights.device)
    visible_all = (everything if visible is None else visible).expand(batch, heads, n, m)
    f64 = torch.float64
    # Per-row values are computed in the logits' dtype (each row is a short sum) and
    # accumulated in float64, per head, as tensors: no host sync per chunk.
    sums = torch.zeros(len(ROW_SUMS), heads, dtype=f64, device=weights.device)
    logit_max = torch.tensor(-math.inf, device=weights.device)
    row_grad_norms = []

    with torch.no_grad():
        for start in range(0, n, chunk_size):
            rows_slice = slice(start, min(n, start + chunk_size))
            a, s = weights[:, :, rows_slice], logits[:, :, rows_slice]
            hidden = ~visible_all[:, :, rows_slice]
            n_visible = (m - hidden.sum(dim=-1)).to(a.dtype)  # (B, h, c)
            valid = n_visible > 0  # a real query with at least one visible key
            comparable = n_visible > 1  # one visible key: entropy 0 of log 1
            row_entropy = attention_entropy(a)
            s_seen = s.masked_fill(hidden, 0.0)
            per_row = [
                row_entropy,
                row_entropy / n_visible.clamp(min=2).log() * comparable,
                comparable,
                (a * (1 - a)).sum(dim=-1),
                a.amax(dim=-1) > SATURATED,
                valid,
                n_visible,
                s_seen.sum(dim=-1),
                s_seen.square().sum(dim=-1),
            ]
            logit_max = torch.maximum(logit_max, s.masked_fill(hidden, -math.inf).amax().float())
            if logits_grad is not None:
                grad = logits_grad[:, :, rows_slice].masked_fill(hidden, 0.0)
                per_row.append(grad.square().sum(dim=-1))
                # padded rows become NaN, which nanmedian skips: no boolean indexing (a host sync)
                row_grad_norms.append(grad.double().norm(dim=-1).masked_fill(~valid, math.nan).flatten())
            rows = torch.stack([value.to(a.dtype) for value in per_row]) * valid  # (K, B, h, c)
            sums[: len(per_row)] += rows.sum(dim=(1, 3), dtype=f64)

    per_head = dict(zip(ROW_SUMS, sums, strict=True))
    total = {key: value.sum() for key, value in per_head.items()}
    rows, entries = total["rows"].clamp(min=1), total["entries"].clamp(min=1)
    mean = total["logit_sum"] / entries
    stats = {
        "entropy": total["entropy"] / rows,
        "entropy_per_head": per_head["entropy"] / per_head["rows"].clamp(min=1),
        "entropy_norm": total["normalised"] / total["normalised_rows"].clamp(min=1),
        "saturation": total["saturated"] / rows,
        "softmax_jac": total["jacobian"] / rows,
        "logit_std": (total["logit_sq"] / entries - mean.square()).clamp(min=0).sqrt(),
        "logit_max": logit_max,
    }
    if logits_grad is not None:
        stats["grad_logits"] = (total["grad_sq"] / entries).sqrt()
        median = torch.cat(row_grad_norms).nanmedian()
        stats["grad_logits_row_median"] = median.nan_to_num(0.0)  # no real row at all: 0
    return {key: value.float() for key, value in stats.items()}
