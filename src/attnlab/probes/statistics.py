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
# Layers of one shape with at most this many attention weights are measured together (records_statistics).
STACKED_SIZE = 2**20
# What layer_statistics adds up over all entries, and per head over rows, in stacking order.
TOTALS = ("jacobian", "saturated", "entries", "logit_sum", "logit_sq", "grad_sq")
PER_HEAD = ("entropy", "rows", "normalised", "normalised_rows")


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

    Several layers of the same shape can be measured in one call, stacked on a leading
    dim, (L, B, h, n, m): each statistic then has that leading dim, one value per layer.
    """
    *lead, heads, n, m = weights.shape  # lead: (B,) or (L, B)
    every = (-4, -3, -2, -1)  # batch, head, query and key dims: all but the layer's
    if visible is None:
        visible = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=weights.device)
    visible = visible.expand(*lead, visible.shape[-3], n, m)  # heads stay broadcast
    # Most sums run over whole chunks, not rows: an entry that is not visible is zeroed
    # first, and so is every entry of a padded row, so it adds nothing. Only what needs a
    # row (normalised entropy, the row median of the gradient) is summed per row. Each
    # chunk's sums are taken in the input's dtype (pairwise, so accurate) and added up in
    # float64, as tensors: no host sync per chunk.
    totals = torch.zeros(len(TOTALS), *lead[:-1], dtype=torch.float64, device=weights.device)
    per_head = torch.zeros(len(PER_HEAD), *lead[:-1], heads, dtype=torch.float64, device=weights.device)
    logit_max = torch.full(lead[:-1], -math.inf, device=weights.device)
    row_grad_norms = []
    tiny, biggest = torch.finfo(weights.dtype).tiny, torch.finfo(weights.dtype).max

    with torch.no_grad():
        for start in range(0, n, chunk_size):
            rows_slice = slice(start, min(n, start + chunk_size))
            seen = visible[..., rows_slice, :]  # (…, B, 1 or h, c, m)
            seen_value = seen.to(weights.dtype)
            a = weights[..., rows_slice, :] * seen_value  # a padded query's row (self-attention) is zeroed
            s = logits[..., rows_slice, :] * seen_value
            n_visible = seen_value.sum(dim=-1).expand(*lead, heads, -1)  # (…, B, h, c)
            valid, comparable = n_visible > 0, n_visible > 1  # one visible key: entropy 0 of log 1

            row_entropy = -(a * a.clamp_min(tiny).log()).sum(dim=-1)  # 0 · log(tiny) = 0 where a = 0
            normalised = row_entropy / n_visible.clamp(min=2).log() * comparable
            per_head += torch.stack([row_entropy, valid, normalised, comparable]).sum(dim=(-3, -1)).double()
            sums = [
                (a * (1 - a)).sum(dim=every),  # jacobian
                # Weights sum to 1, so a row has at most one weight above 0.99: count entries.
                (a > SATURATED).sum(dim=every),
                n_visible.sum(dim=every[1:]),
                s.sum(dim=every),
                s.square().sum(dim=every),
            ]
            # hidden entries of s are 0; pushed to -max they can never be the maximum
            logit_max = torch.maximum(logit_max, (s + (seen_value - 1) * biggest).amax(dim=every).float())
            if logits_grad is not None:
                grad_sq = (logits_grad[..., rows_slice, :] * seen_value).square().sum(dim=-1)  # (…, B, h, c)
                sums.append(grad_sq.sum(dim=every[1:]))
                # padded rows become NaN, which nanmedian skips: no boolean indexing (a host sync)
                row_grad_norms.append(grad_sq.sqrt().masked_fill(~valid, math.nan).flatten(-3))
            totals[: len(sums)] += torch.stack(sums).double()

    total = dict(zip(TOTALS, totals, strict=True))
    head = dict(zip(PER_HEAD, per_head, strict=True))
    rows, entries = head["rows"].sum(dim=-1).clamp(min=1), total["entries"].clamp(min=1)
    mean = total["logit_sum"] / entries
    stats = {
        "entropy": head["entropy"].sum(dim=-1) / rows,
        "entropy_per_head": head["entropy"] / head["rows"].clamp(min=1),
        "entropy_norm": head["normalised"].sum(dim=-1) / head["normalised_rows"].sum(dim=-1).clamp(min=1),
        "saturation": total["saturated"] / rows,
        "softmax_jac": total["jacobian"] / rows,
        "logit_std": (total["logit_sq"] / entries - mean.square()).clamp(min=0).sqrt(),
        "logit_max": torch.where(logit_max > -biggest, logit_max, -math.inf),  # nothing visible: -inf
    }
    if logits_grad is not None:
        stats["grad_logits"] = (total["grad_sq"] / entries).sqrt()
        median = torch.cat(row_grad_norms, dim=-1).nanmedian(dim=-1).values
        stats["grad_logits_row_median"] = median.nan_to_num(0.0)  # no real row at all: 0
    return {key: value.float() for key, value in stats.items()}


@torch.no_grad()
def records_statistics(records: list, chunk_size: int = 256) -> list[dict[str, Tensor]]:
    """``layer_statistics`` of each ``AttentionRecord``, in order.

    At small sizes a call costs a fixed ~0.5 ms, more than its arithmetic, so small
    layers of one shape are stacked and measured in one call (padding layers of other
    shapes to a common one measured slower). Large layers go one by one: the probe never
    holds a second copy of them.
    """
    groups: dict[tuple, list[int]] = {}
    for index, record in enumerate(records):
        visible = None if record.visible is None else tuple(record.visible.shape)
        shapes = (tuple(record.weights.shape), visible, record.weights.dtype, record.logits.grad is None)
        groups.setdefault(shapes if record.weights.numel() <= STACKED_SIZE else (index,), []).append(index)
    results: list = [None] * len(records)
    for members in groups.values():
        group = [records[index] for index in members]
        fields = ([record.weights for record in group], [record.logits for record in group],
                  [record.logits.grad for record in group], [record.visible for record in group])  # fmt: skip
        stats = layer_statistics(*(stacked(values) for values in fields), chunk_size)
        for position, index in enumerate(members):
            results[index] = {key: value[position] for key, value in stats.items()} if len(group) > 1 else stats
    return results


def stacked(values: list[Tensor | None]) -> Tensor | None:
    """The values on a new leading dim, or the one value itself (None stays None)."""
    if values[0] is None:
        return None
    return torch.stack(values) if len(values) > 1 else values[0]
