"""Range checks shared by the Python API and the config checks.

Each raises ``ValueError("<name>=<value> is not valid; it must be <range>")``: the
message starts with the argument's name, so ``attnlab.config`` can prefix the config
group (``d_k=0 …`` becomes ``model.d_k=0 …``).
"""

from __future__ import annotations

import math
from numbers import Integral, Real


def _fail(name: str, value, must: str):
    raise ValueError(f"{name}={value!r} is not valid; it must be {must}")


def is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not (isinstance(value, Integral) and not isinstance(value, bool) and value > 0):
        _fail(name, value, "a positive integer" + (" (or null)" if allow_none else ""))


def non_negative_int(name: str, value) -> None:
    if not (isinstance(value, Integral) and not isinstance(value, bool) and value >= 0):
        _fail(name, value, "an integer >= 0")


def positive_number(name: str, value, allow_none: bool = False) -> None:
    """Finite and > 0 (a divisor, a rate, a size)."""
    if value is None and allow_none:
        return
    if not (is_number(value) and math.isfinite(value) and value > 0):
        _fail(name, value, "a finite number > 0" + (" (or null)" if allow_none else ""))


def non_negative_number(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not (is_number(value) and math.isfinite(value) and value >= 0):
        _fail(name, value, "a finite number >= 0" + (" (or null)" if allow_none else ""))


def probability(name: str, value) -> None:
    """A dropout rate or smoothing: in [0, 1)."""
    if not (is_number(value) and 0 <= value < 1):
        _fail(name, value, "a number in [0, 1)")
