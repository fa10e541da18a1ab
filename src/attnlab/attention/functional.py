"""The *weight* and *aggregate* steps of attention, as plain functions.

    Attention(Q, K, V) = softmax(Q Kᵀ / τ) V

Two paths compute it:

* the fast path hands the work to ``torch.nn.functional.scaled_dot_product_attention``
  (fused kernels, flash on GPU). A temperature is applied by dividing q by τ and calling
  SDPA with ``scale=1.0``: exact, differentiable in τ, and the fused kernel is kept.
* the explicit path materialises the logits and the weights. It is used when the weights
  are wanted (probes, tests) and for score functions with no fused form (additive).

Masks follow SDPA's convention: a boolean ``mask`` is True where a query *may* attend.
``causal=True`` lets query i see keys j <= i (top-left aligned, as SDPA's ``is_causal``).
A query row whose keys are all masked gets zero weights and a zero output, on both
paths, so no NaN reaches the loss or the gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def visibility(mask: Tensor | None, causal: bool, n: int, m: int, device: torch.device) -> Tensor | None:
    """Combine a user mask and the causal rule into one bool mask (True = may attend)."""
    if causal:
        causal_mask = torch.ones(n, m, dtype=torch.bool, device=device).tril()
        mask = causal_mask if mask is None else mask & causal_mask
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = may attend), got {mask.dtype}")
    return mask


def attend(logits: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0):
    """Explicit weight + aggregate: softmax over the last dim of ``logits``, then × v.

    ``logits`` are already divided by τ. Returns ``(out, weights)``.
    """
    if mask is not None:
        # finfo.min rather than -inf: a fully masked row then softmaxes to a uniform
        # row (no NaN in forward or backward), which is zeroed just below.
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    weights = torch.softmax(logits, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    tau: float | Tensor = 1.0,
    mask: Tensor | None = None,
    causal: bool = False,
    need_weights: bool = False,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor | None]:
    """Dot-product attention softmax(q kᵀ / τ) v.

    q: (..., n, d_k), k: (..., m, d_k), v: (..., m, d_v).
    tau: a float, or a tensor broadcastable to q (e.g. one per head, shape (h, 1, 1)).
    mask: bool, broadcastable to (..., n, m), True = may attend.
    Returns out (..., n, d_v) and weights (..., n, m), the latter None unless need_weights.
    """
    n, m = q.shape[-2], k.shape[-2]
    if need_weights:
        logits = (q @ k.transpose(-2, -1)) / tau
        return attend(logits, v, visibility(mask, causal, n, m, q.device), dropout_p)
    if isinstance(tau, Tensor):
        q, scale = q / tau, 1.0
    else:
        # A fixed τ costs nothing extra: SDPA applies it inside the kernel.
        scale = 1.0 / tau
    if mask is None:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)
        return out, None
    mask = visibility(mask, causal, n, m, q.device)
    # Since torch 2.5 every SDPA backend gives fully masked rows a zero output (its
    # "safe softmax", pytorch#133882), as the explicit path does; no extra pass needed.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale), None
