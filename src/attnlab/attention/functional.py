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

from attnlab.checks import positive_number, probability


def visibility(mask: Tensor | None, causal: bool, n: int, m: int, device: torch.device) -> Tensor | None:
    """Combine a user mask and the causal rule into one bool mask (True = may attend)."""
    if causal:
        causal_mask = torch.ones(n, m, dtype=torch.bool, device=device).tril()
        mask = causal_mask if mask is None else mask & causal_mask
    return mask


def key_counts(mask: Tensor | None, causal: bool, n: int, m: int, device: torch.device) -> Tensor:
    """How many keys each query row may attend to: a float tensor broadcastable to (..., n, 1).

    A row that may see no key at all (a padded target position in cross-attention) counts
    as 1: its output is zero whatever τ is, and no rule then divides by 0 or takes log 0.
    """
    if mask is None:
        if not causal:
            return torch.full((1, 1), float(m), device=device)
        return torch.arange(1, n + 1, device=device).clamp(max=m).float().unsqueeze(-1)
    return visibility(mask, causal, n, m, device).sum(-1, keepdim=True).clamp(min=1).float()


def check_mask(mask: Tensor, expected: tuple, name: str = "mask") -> None:
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool tensor (True = may attend, SDPA's convention); got {mask.dtype}. "
            f"For a 0/1 mask use {name}.bool(); additive float masks are not supported"
        )
    try:
        fits = torch.broadcast_shapes(mask.shape, expected) == torch.Size(expected)
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"{name} of shape {tuple(mask.shape)} does not broadcast to (..., n, m) = {tuple(expected)}")


def check_inputs(q: Tensor, k: Tensor, v: Tensor, tau: float | Tensor, mask: Tensor | None) -> None:
    """The boundary checks of ``attention``: shapes that agree, a bool mask, a finite τ > 0."""
    shapes = f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(f"q, k, v must have shape (..., length, dim); {shapes}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q (..., n, d_k) and k (..., m, d_k) must share d_k; {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k (..., m, d_k) and v (..., m, d_v) must share m; {shapes}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"q, k, v must have matching leading (batch, head) dims; {shapes}") from None
    if mask is not None:
        check_mask(mask, (*q.shape[:-1], k.shape[-2]))
    if isinstance(tau, Tensor):
        try:
            fits = torch.broadcast_shapes(tau.shape, q.shape) == q.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"tau of shape {tuple(tau.shape)} does not broadcast to q's shape {tuple(q.shape)}")
        # A learned τ is exp(log τ), positive by construction; a given one is checked (a host sync).
        if not tau.requires_grad and not bool(torch.isfinite(tau).all() and (tau > 0).all()):
            raise ValueError(f"tau must be finite and > 0; got {tau.flatten()[:8].tolist()}")
    else:
        positive_number("tau", tau)


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


def fast_attention(
    q: Tensor, k: Tensor, v: Tensor, tau: float | Tensor, mask: Tensor | None, causal: bool, dropout_p: float
) -> Tensor:
    """The fast path on inputs already checked: SDPA with τ applied to q (or as SDPA's scale)."""
    if isinstance(tau, Tensor):
        q, scale = q / tau, 1.0
    else:
        # A fixed τ costs nothing extra: SDPA applies it inside the kernel.
        scale = 1.0 / tau
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)
    mask = visibility(mask, causal, q.shape[-2], k.shape[-2], q.device)
    # Since torch 2.5 every SDPA backend gives fully masked rows a zero output (its
    # "safe softmax", pytorch#133882), as the explicit path does; no extra pass needed.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


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
    tau: a finite float > 0, or a tensor broadcastable to q (e.g. one per head, shape (h, 1, 1)).
    mask: bool, broadcastable to (..., n, m), True = may attend.
    Returns out (..., n, d_v) and weights (..., n, m), the latter None unless need_weights.
    Inputs that do not fit raise ValueError/TypeError naming the argument and the shape expected.
    """
    check_inputs(q, k, v, tau, mask)
    probability("dropout_p", dropout_p)
    if need_weights:
        logits = (q @ k.transpose(-2, -1)) / tau
        return attend(logits, v, visibility(mask, causal, q.shape[-2], k.shape[-2], q.device), dropout_p)
    return fast_attention(q, k, v, tau, mask, causal, dropout_p), None
