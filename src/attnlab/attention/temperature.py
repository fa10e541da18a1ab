"""Temperature rules: the divisor τ in softmax(q·k / τ).

Each rule is a module built as ``Rule(d_k, n_heads, **options)`` whose ``forward()``
returns τ: a float for fixed rules (SDPA then applies it for free), a tensor of shape
(h, 1, 1) or (1, 1, 1) for learned ones (broadcasts over (batch, h, n, d_k)).

* ``none``    τ = 1: unscaled dot product; logits grow like √d_k.
* ``sqrt_dk`` τ = √d_k: Vaswani et al. 2017 §3.2.1; unit-variance logits at init.
* ``dk``      τ = d_k: μP (Yang et al. 2022, "Tensor Programs V"), which expects q and
  k to become correlated in training so that q·k grows like d_k.
* ``learned`` τ = exp(log τ), per head or per layer, initialised at √d_k unless told
  otherwise; cf. QK-norm's learned scale g = 1/τ (Henry et al. 2020).
* a number    a fixed divisor.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.checks import positive_int, positive_number


class Temperature(nn.Module):
    """Base class; parameters of a temperature are kept out of weight decay."""

    def __init__(self, d_k: int, n_heads: int):
        super().__init__()
        positive_int("d_k", d_k)
        positive_int("n_heads", n_heads)
        self.d_k, self.n_heads = d_k, n_heads

    def forward(self) -> float | Tensor:
        raise NotImplementedError


class Fixed(Temperature):
    def __init__(self, d_k: int, n_heads: int, value: float = 1.0):
        super().__init__(d_k, n_heads)
        positive_number("tau", value)
        self.value = float(value)

    def forward(self) -> float:
        return self.value

    def extra_repr(self) -> str:
        return f"tau={self.value:g}"


class NoScale(Fixed):
    def __init__(self, d_k: int, n_heads: int):
        super().__init__(d_k, n_heads, 1.0)


class SqrtDk(Fixed):
    def __init__(self, d_k: int, n_heads: int):
        super().__init__(d_k, n_heads, math.sqrt(d_k))


class Dk(Fixed):
    def __init__(self, d_k: int, n_heads: int):
        super().__init__(d_k, n_heads, float(d_k))


class Learned(Temperature):
    """τ = exp(log_tau): positive by construction, multiplicative steps in log space."""

    def __init__(self, d_k: int, n_heads: int, init: float | None = None, per_head: bool = True):
        super().__init__(d_k, n_heads)
        positive_number("tau_init", init, allow_none=True)
        init = math.sqrt(d_k) if init is None else float(init)
        shape = (n_heads, 1, 1) if per_head else (1, 1, 1)
        self.log_tau = nn.Parameter(torch.full(shape, math.log(init)))

    def forward(self) -> Tensor:
        return self.log_tau.exp()


TEMPERATURES: dict[str, type[Temperature]] = {
    "none": NoScale,
    "sqrt_dk": SqrtDk,
    "dk": Dk,
    "learned": Learned,
}


def parse_rule(rule: str | float) -> str | float:
    """A rule name (a key of TEMPERATURES) or a finite positive divisor (a number or numeric string)."""
    if isinstance(rule, str) and rule in TEMPERATURES:
        return rule
    try:
        value = float(rule)
    except (TypeError, ValueError):
        value = None
    if isinstance(rule, bool) or value is None or not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"scale={rule!r} is not valid; accepted values: {', '.join(TEMPERATURES)}, <a finite number > 0>"
        )
    return value


def make_temperature(rule: str | float, d_k: int, n_heads: int, **options) -> Temperature:
    """Build the rule named ``rule`` (a key of TEMPERATURES) or a fixed divisor (a number).

    ``options`` go to the learned rule (``init``, ``per_head``) and are ignored by fixed
    rules, so one attention config can carry them whatever the scale.
    """
    rule = parse_rule(rule)
    if not isinstance(rule, str):
        return Fixed(d_k, n_heads, rule)
    cls = TEMPERATURES[rule]
    return cls(d_k, n_heads, **options) if issubclass(cls, Learned) else cls(d_k, n_heads)


def tau_values(temperature: Temperature) -> Tensor:
    """τ per head as a detached 1-D tensor of length n_heads (for logging)."""
    tau = temperature()
    tau = torch.as_tensor(tau, dtype=torch.float32).detach().flatten().cpu()
    return tau.expand(temperature.n_heads) if tau.numel() == 1 else tau
