"""Attention variants: score functions registered under a name that Hydra selects.

A variant replaces the score in softmax(score(q, k) / τ). It is a ``Score`` subclass
in its own file under ``attnlab/attention/variants/`` (imported automatically), with
``conf/attention/<name>.yaml`` selecting it; the contract tests pick it up by itself.

    @register_variant("my_score")
    class MyScore(Score):
        fused = False
        def forward(self, q, k):          # (..., n, d_k), (..., m, d_k) -> (..., n, m)
            ...
"""

from __future__ import annotations

import importlib
import pkgutil

from torch import Tensor, nn

VARIANTS: dict[str, type[Score]] = {}


class Score(nn.Module):
    """Unscaled attention scores. Built as ``Score(d_k, n_heads, **options)``.

    A *fused* score is a plain dot product of transformed q and k, so the fast path
    (SDPA) can compute it: such a score implements ``prepare``. Any other score
    implements ``forward`` and always takes the explicit path. A *linear* score is
    linear in q (``prepare`` leaves q as it is, as the dot product does): q/τ may then be
    formed on W_Q instead of on q.
    """

    fused: bool = True
    linear: bool = False

    def __init__(self, d_k: int, n_heads: int):
        super().__init__()
        self.d_k, self.n_heads = d_k, n_heads

    def prepare(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        q, k = self.prepare(q, k)
        return q @ k.transpose(-2, -1)


def registrar(table: dict, base: type, kind: str, name: str):
    """A class decorator that files a subclass of ``base`` in ``table`` under ``name``."""

    def register(cls):
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"{kind} {name!r} must be a subclass of attnlab.attention.{base.__name__}")
        if name in table and table[name] is not cls:
            raise ValueError(f"{kind} {name!r} is already registered by {table[name]}")
        table[name] = cls
        return cls

    return register


def register_variant(name: str):
    """Class decorator: make a ``Score`` subclass selectable as ``attention.variant=name``."""
    return registrar(VARIANTS, Score, "variant", name)


def variant_class(variant: str) -> type[Score]:
    if variant not in VARIANTS:
        raise ValueError(
            f"variant={variant!r} is not a registered variant; "
            f"use one of {sorted(VARIANTS)} (or register yours with @register_variant)"
        )
    return VARIANTS[variant]


def make_score(variant: str, d_k: int, n_heads: int, **options) -> Score:
    return variant_class(variant)(d_k, n_heads, **options)


def import_all(package) -> None:
    """Import every module of ``package``, so that each registers what it defines."""
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")


def load_variants() -> None:
    from attnlab.attention import variants

    import_all(variants)
