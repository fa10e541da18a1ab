"""Temperature rules: the divisor τ in softmax(score(q, k) / τ), registered by name.

A rule is a ``Temperature`` subclass in its own file under ``attnlab/attention/rules/``
(imported automatically), selected by ``attention.scale=<name>``; the contract tests
pick it up by itself. It is built as ``Rule(d_k, n_heads, **options)``, the options
being ``attention.scale_options.<name>``, and called at every forward as

    tau = rule(n_keys)

``n_keys`` is the number of keys each query row may attend to (after the padding mask
and the causal rule), a float tensor broadcastable to (batch, h, n, 1), given only to
rules that set ``uses_keys = True`` (None otherwise). τ is a float, or a tensor
broadcastable to the logits (batch, h, n, m) that is constant along the keys, e.g. one
per head (h, 1, 1) or one per query row (batch, h, n, 1): the fast path then divides q
by it and keeps SDPA's fused kernel.

    @register_temperature("half_sqrt_dk")
    class HalfSqrtDk(Temperature):
        def forward(self, n_keys=None):
            return self.d_k**0.5 / 2

A number where a rule name is expected is a fixed divisor.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import Tensor, nn

from attnlab.attention.registry import import_all, registrar
from attnlab.checks import positive_int, positive_number


class Temperature(nn.Module):
    """Base class of the rules. Parameters of a rule are kept out of weight decay."""

    uses_keys: bool = False  # True: forward() gets n_keys, the visible keys per query row

    def __init__(self, d_k: int, n_heads: int):
        super().__init__()
        positive_int("d_k", d_k)
        positive_int("n_heads", n_heads)
        self.d_k, self.n_heads = d_k, n_heads

    def forward(self, n_keys: Tensor | None = None) -> float | Tensor:
        raise NotImplementedError

    def logged(self) -> dict[str, Tensor]:
        """What the temperature probe logs per head, as ``attn/<key>/<layer>.H<h>``.

        By default τ itself (for rules with parameters); a rule whose τ depends on the
        number of keys logs its parameters instead (``ssmax``: its s).
        """
        return {"tau": per_head(self(), self.n_heads)}


class Fixed(Temperature):
    """A fixed divisor: ``attention.scale=<number>``."""

    def __init__(self, d_k: int, n_heads: int, value: float = 1.0):
        super().__init__(d_k, n_heads)
        positive_number("tau", value)
        self.value = float(value)

    def forward(self, n_keys: Tensor | None = None) -> float:
        return self.value

    def extra_repr(self) -> str:
        return f"tau={self.value:g}"


TEMPERATURES: dict[str, type[Temperature]] = {}


def register_temperature(name: str):
    """Class decorator: make a ``Temperature`` subclass selectable as ``attention.scale=name``."""
    return registrar(TEMPERATURES, Temperature, "temperature rule", name)


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
            f"scale={rule!r} is not valid; accepted values: {', '.join(TEMPERATURES)}, <a finite number > 0> "
            "(or register your own rule with @register_temperature)"
        )
    return value


def rule_options(rule: str | float) -> list[str]:
    """The options a rule's constructor takes (beyond d_k and n_heads)."""
    rule = parse_rule(rule)
    if not isinstance(rule, str):
        return []
    parameters = list(inspect.signature(TEMPERATURES[rule].__init__).parameters)
    return [name for name in parameters if name not in ("self", "d_k", "n_heads", "args", "kwargs")]


def make_temperature(rule: str | float, d_k: int, n_heads: int, **options) -> Temperature:
    """Build the rule named ``rule`` (a key of TEMPERATURES) with its options, or a fixed divisor.

    A bad option raises ValueError naming it as ``scale_options.<rule>.<option>``.
    """
    rule = parse_rule(rule)
    if not isinstance(rule, str):
        if options:
            raise ValueError(f"scale={rule:g} is a fixed divisor and takes no options; got {sorted(options)}")
        return Fixed(d_k, n_heads, rule)
    accepted = rule_options(rule)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"scale_options.{rule}.{unknown[0]} is not an option of the {rule!r} rule; "
            f"its options: {', '.join(accepted) or 'none'}"
        )
    try:
        return TEMPERATURES[rule](d_k, n_heads, **options)
    except ValueError as error:
        message = str(error)
        if message.split("=", 1)[0] in options:  # "init=0 is not valid…" → "scale_options.learned.init=0 …"
            message = f"scale_options.{rule}.{message}"
        raise ValueError(message) from None


def per_head(tau: float | Tensor, n_heads: int) -> Tensor:
    """τ (a float, or a tensor of one value per head or one in all) as a detached 1-D tensor of length n_heads."""
    tau = torch.as_tensor(tau, dtype=torch.float32).detach().flatten().cpu()
    return tau.expand(n_heads) if tau.numel() == 1 else tau


def tau_values(temperature: Temperature) -> Tensor:
    """τ per head as a detached 1-D tensor of length n_heads (for rules whose τ needs no n_keys)."""
    return per_head(temperature(), temperature.n_heads)


def load_rules() -> None:
    from attnlab.attention import rules

    import_all(rules)
