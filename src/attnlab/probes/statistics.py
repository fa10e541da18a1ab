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

Padded queries and keys are left out. So are rows that see a single key (the first query
of causal self-attention, about 1 row in 9 of the default model at init) from entropy,
saturation, Σa(1−a) and grad/logits: such a row's weight is 1 whatever its logits, so it
would read as saturated, with entropy 0 and no gradient, and say nothing about the
temperature. The logit statistics keep them (their logits are real). Rows are processed
in chunks of queries, so the temporaries stay bounded however long the sequence is.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SATURATED = 0.99
# Layers of one shape with at most this many attention weights are measured together (records_statistics).
STACKED_SIZE = 2**20
# What layer_sums adds up over all entries, and per head over rows, in stacking order.
TOTALS = ("jacobian", "saturated", "entries", "logit_sum", "logit_sq", "grad_sq", "grad_entries")
PER_HEAD = ("entropy", "rows", "normalised")
# Sums over rows and entries: under DDP the ranks' sums add up (the other two: max, gathered).
SUMS = (*TOTALS, *PER_HEAD)


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
    row with no visible key (a padded query) is left out, and so is a row with one (the
    first query of causal self-attention: its weight is 1 whatever the logits) from
    everything but the logit statistics. None = all visible.
    Returns scalars, and ``entropy_per_head`` of shape (h,).

    Several layers of the same shape can be measured in one call, stacked on a leading
    dim, (L, B, h, n, m): each statistic then has that leading dim, one value per layer.
    """
    return finish(layer_sums(weights, logits, logits_grad, visible, chunk_size))


def layer_sums(
    weights: Tensor,
    logits: Tensor,
    logits_grad: Tensor | None = None,
    visible: Tensor | None = None,
    chunk_size: int = 256,
) -> dict[str, Tensor]:
    """What ``finish`` turns into statistics: sums over rows and entries (SUMS), the logit
    maximum, and each counted row's gradient norm (NaN for rows not counted), so that DDP
    ranks can combine theirs exactly before finishing."""
    *lead, heads, n, m = weights.shape  # lead: (B,) or (L, B)
    every = (-4, -3, -2, -1)  # batch, head, query and key dims: all but the layer's
    if visible is None:
        visible = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=weights.device)
    visible = visible.expand(*lead, visible.shape[-3], n, m)  # heads stay broadcast
    # Most sums run over whole chunks, not rows: an entry that is not visible is zeroed
    # first, and so is every entry of a row not counted, so it adds nothing. Only what needs
    # a row (normalised entropy, the row median of the gradient) is summed per row. Each
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
            n_visible = seen_value.sum(dim=-1, keepdim=True)  # (…, B, 1 or h, c, 1)
            # Rows with a choice to make: a row that sees one key has weight 1 on it whatever the
            # logits, so it would read as saturated with no gradient; rows that see none are padding.
            counted_value = seen_value * (n_visible > 1)
            counted = (n_visible[..., 0] > 1).expand(*lead, heads, -1)  # (…, B, h, c)
            a = weights[..., rows_slice, :] * counted_value
            s = logits[..., rows_slice, :] * seen_value  # the logit statistics keep every visible entry

            row_entropy = -(a * a.clamp_min(tiny).log()).sum(dim=-1)  # 0 · log(tiny) = 0 where a = 0
            normalised = row_entropy / n_visible[..., 0].clamp(min=2).log()
            per_head += (
                torch.stack([row_entropy, counted.to(a.dtype), normalised.expand_as(row_entropy)])
                .sum(dim=(-3, -1))
                .double()
            )
            sums = [
                (a * (1 - a)).sum(dim=every),  # jacobian
                # Weights sum to 1, so a row has at most one weight above 0.99: count entries.
                (a > SATURATED).sum(dim=every),
                seen_value.expand(*lead, heads, -1, -1).sum(dim=every),
                s.sum(dim=every),
                s.square().sum(dim=every),
            ]
            # hidden entries of s are 0; pushed to -max they can never be the maximum
            logit_max = torch.maximum(logit_max, (s + (seen_value - 1) * biggest).amax(dim=every).float())
            if logits_grad is not None:
                grad_sq = (logits_grad[..., rows_slice, :] * counted_value).square().sum(dim=-1)  # (…, B, h, c)
                sums += [grad_sq.sum(dim=every[1:]), counted_value.expand(*lead, heads, -1, -1).sum(dim=every)]
                # rows not counted become NaN, which nanmedian skips: no boolean indexing (a host sync)
                row_grad_norms.append(grad_sq.sqrt().masked_fill(~counted, math.nan).flatten(-3))
            totals[: len(sums)] += torch.stack(sums).double()

    found = {**dict(zip(TOTALS, totals, strict=True)), **dict(zip(PER_HEAD, per_head, strict=True))}
    found["logit_max"] = logit_max
    if logits_grad is not None:
        found["row_grad_norms"] = torch.cat(row_grad_norms, dim=-1)
    return found


def finish(found: dict[str, Tensor]) -> dict[str, Tensor]:
    """The statistics from ``layer_sums`` (or the sums of several ranks')."""
    rows = found["rows"].sum(dim=-1).clamp(min=1)
    entries = found["entries"].clamp(min=1)
    mean = found["logit_sum"] / entries
    biggest = torch.finfo(found["logit_max"].dtype).max
    stats = {
        "entropy": found["entropy"].sum(dim=-1) / rows,
        "entropy_per_head": found["entropy"] / found["rows"].clamp(min=1),
        "entropy_norm": found["normalised"].sum(dim=-1) / rows,
        "saturation": found["saturated"] / rows,
        "softmax_jac": found["jacobian"] / rows,
        "logit_std": (found["logit_sq"] / entries - mean.square()).clamp(min=0).sqrt(),
        "logit_max": torch.where(found["logit_max"] > -biggest, found["logit_max"], -math.inf),  # nothing visible
    }
    if "row_grad_norms" in found:
        stats["grad_logits"] = (found["grad_sq"] / found["grad_entries"].clamp(min=1)).sqrt()
        median = found["row_grad_norms"].nanmedian(dim=-1).values
        stats["grad_logits_row_median"] = median.nan_to_num(0.0)  # no counted row at all: 0
    return {key: value.float() for key, value in stats.items()}


@torch.no_grad()
def records_statistics(records: list, chunk_size: int = 256) -> list[dict[str, Tensor]]:
    """``layer_statistics`` of each ``AttentionRecord``, in order."""
    return [finish(found) for found in records_sums(records, chunk_size)]


@torch.no_grad()
def records_sums(records: list, chunk_size: int = 256, grad_scale: float = 1.0) -> list[dict[str, Tensor]]:
    """``layer_sums`` of each ``AttentionRecord``, in order; the logits' gradients × ``grad_scale``.

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
        grads = [None if record.logits.grad is None else record.logits.grad * grad_scale for record in group]
        fields = ([record.weights for record in group], [record.logits for record in group], grads,
                  [record.visible for record in group])  # fmt: skip
        found = layer_sums(*(stacked(values) for values in fields), chunk_size)
        for position, index in enumerate(members):
            results[index] = {key: value[position] for key, value in found.items()} if len(group) > 1 else found
    return results


def stacked(values: list[Tensor | None]) -> Tensor | None:
    """The values on a new leading dim, or the one value itself (None stays None)."""
    if values[0] is None:
        return None
    return torch.stack(values) if len(values) > 1 else values[0]
