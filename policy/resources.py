"""Units and Kubernetes resource quantities: the one quantity parser of the project.

The domain model counts CPU in millicores, memory in MiB and GPU in *milli-cards*: one card is
:data:`MILLI_PER_CARD` milli. A pod asks either for whole cards (``num_gpu`` cards of 1000 milli)
or for a share of one card (``num_gpu == 1`` and ``gpu_milli < 1000``).

Quantities follow ``k8s.io/apimachinery/pkg/api/resource``: an optional sign, a decimal number
(``1``, ``1.5``, ``1.``, ``.5``) and one suffix — decimal SI (``n u m k M G T P E``), binary SI
(``Ki … Ei``) or a decimal exponent (``e3``, ``E-2``). Non-zero values are rounded up to 1n like the
API server does, then up to the unit asked for. The parser is bounded, because pods come from anyone
who can create one and kube-apiserver stores ``cpu: "1e999999"`` happily:

- the text is at most :data:`MAX_QUANTITY_CHARS` characters (ASCII digits only, no whitespace);
- the exponent is read as a small number and compared before any power of ten is built, and the
  exact arithmetic runs only for values in a window around the units, so every parse costs a few
  microseconds whatever the exponent;
- a value that reaches :data:`QUANTITY_LIMIT` units raises :class:`QuantityTooLarge`, or, with
  ``saturate=True`` (a pod's request), reads as :data:`QUANTITY_LIMIT` — more than any node holds,
  so feasibility reports the pod unschedulable instead of the parser failing;
- error messages quote at most :data:`QUOTE_CHARS` characters of the input (:func:`clip`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MILLI_PER_CARD = 1000
"""GPU milli in one card."""

MAX_QUANTITY_CHARS = 64
"""Longer quantity strings are refused. Kubernetes' canonical forms are far shorter ("1500m",
"16Gi", "1e999999"); the cap keeps every parse, and every number the parse builds, small."""

QUANTITY_LIMIT = 2**53
"""No converted quantity (millicores, bytes, MiB, a count) reaches this: arrays and kernels
downstream are int64 and sums of a few such values must not overflow. A pod's request at or above
it reads as exactly this much (``saturate=True``); a node's or a trace's is an error."""

MEMORY_MIB_LIMIT = QUANTITY_LIMIT >> 20
"""Memory in MiB whose bytes reach :data:`QUANTITY_LIMIT` (2**33 MiB: 8 PiB). Kubernetes' scorers count
memory in bytes in int64 (:mod:`rlsched.policy.scorers.kubernetes` keeps Go's arithmetic, bytes × 100), so
memory is bounded in bytes, not in MiB: a node's memory is below this, as the extender reads a node (its
bytes below :data:`QUANTITY_LIMIT`), and a pod's request is at most this, the extender's saturated
request (more than any node holds). A trace file or a spec beyond it is refused where it is read."""

QUOTE_CHARS = 20
"""Characters of an offending input quoted in error messages."""

_DECIMAL_SUFFIX = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIX = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
# Unambiguous (each character has one place to go), so matching is linear; the length cap bounds it anyway.
_QUANTITY = re.compile(
    r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?", re.ASCII
)
_EXPONENT_CLAMP = 10**6
"""Exponents are clamped to ±this: far beyond every value the window below computes exactly."""
_NANO = 10**9
_HUGE_LOG10 = 40
"""Values of 10**40 nano-units or more are beyond :data:`QUANTITY_LIMIT` in every unit, so they are
never computed; the largest exact computation is a number of about 10**(64 + 40) — microseconds."""


class QuantityError(ValueError):
    """A Kubernetes resource quantity that cannot be used; the message quotes at most a short prefix of it."""


class QuantityTooLarge(QuantityError):
    """A valid quantity at or above :data:`QUANTITY_LIMIT` units (callers that accept it pass ``saturate=True``)."""


def clip(value: object) -> str:
    """A short, safe rendering of an untrusted value for messages: ``'1e999999'``,
    ``'11111111111111111111'… (5000 characters)``; never a huge int turned into text."""
    if isinstance(value, str):
        if len(value) <= QUOTE_CHARS:
            return repr(value)
        return f"{value[:QUOTE_CHARS]!r}… ({len(value)} characters)"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() <= 64:
            return str(value)
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, float):
        return repr(value)
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class Quantity:
    """An exact parsed quantity: ``(-1 if negative else 1) × int(digits) × 10**exp10 × 2**exp2``.

    ``digits`` has no leading zeros ("" for zero); ``exp10`` is clamped to ±10**6 (values that far
    out are saturated or rounded up to 1n before any arithmetic); ``exp2`` is 0 or a binary suffix's.
    """

    negative: bool
    digits: str
    exp10: int
    exp2: int = 0

    def nano(self) -> int | None:
        """``ceil(|value| × 10**9)`` — the API server's round-up to 1n — or None when it is at least
        10**40 (beyond :data:`QUANTITY_LIMIT` in every unit). Bounded work for any exponent."""
        if not self.digits:
            return 0
        shift = self.exp10 + 9
        # |value| × 10**9 lies in [10**(len-1+shift) × 2**exp2, 10**(len+shift) × 2**exp2).
        if len(self.digits) - 1 + shift + self.exp2 * math.log10(2) >= _HUGE_LOG10:
            return None
        if len(self.digits) + shift + self.exp2 * math.log10(2) < 0:
            return 1  # a positive value below 1n: rounded up to 1n
        num = int(self.digits) << self.exp2
        # typeshed types int ** int as Any (a negative exponent gives a float); both exponents are ≥ 0 here
        if shift >= 0:
            scale: int = 10**shift
            return num * scale
        divisor: int = 10**-shift
        return -(-num // divisor)


def parse_quantity(value: str | int | float) -> Quantity:
    """Parse a Kubernetes quantity (``"500m"``, ``"2"``, ``"16Gi"``, ``"1e3"``); ints and finite
    floats (YAML/JSON numbers) are read as their decimal text.

    Raises :class:`QuantityError` naming a short prefix of the input when it is not a quantity.
    """
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity such as '500m' or '16Gi', got {value!r}")
    if isinstance(value, int):
        if value.bit_length() > 200:  # > 60 digits: refused like a string over the cap, without stringifying it
            raise QuantityError(f"{clip(value)} is longer than {MAX_QUANTITY_CHARS} characters")
        text = str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a Kubernetes quantity (examples: '500m', '2', '16Gi')")
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise QuantityError(f"expected a quantity such as '500m' or '16Gi', got {clip(value)}")
    if len(text) > MAX_QUANTITY_CHARS:
        raise QuantityError(
            f"{clip(text)} is longer than {MAX_QUANTITY_CHARS} characters; not a quantity this scheduler reads"
        )
    match = _QUANTITY.fullmatch(text)
    if not match or not (match.group(2) or match.group(3)):
        raise QuantityError(f"{clip(text)} is not a Kubernetes quantity (examples: '500m', '2', '16Gi')")
    sign, whole, frac, exponent, suffix = match.groups()
    frac = frac or ""
    exp10 = -len(frac)
    exp2 = 0
    if exponent is not None:
        # At most 63 characters: int() is cheap; clamp before it is used in any arithmetic.
        exp10 += max(-_EXPONENT_CLAMP, min(_EXPONENT_CLAMP, int(exponent)))
    elif suffix in _BINARY_SUFFIX:
        exp2 = _BINARY_SUFFIX[suffix]
    else:
        exp10 += _DECIMAL_SUFFIX[suffix or ""]
    digits = (whole + frac).lstrip("0")
    trailing = len(digits) - len(digits.rstrip("0"))
    return Quantity(
        negative=sign == "-" and bool(digits),
        digits=digits[: len(digits) - trailing],
        exp10=exp10 + trailing,
        exp2=exp2,
    )


_CONVERTED: dict[tuple[str, int, bool, bool], int] = {}
_CONVERTED_MAX = 4096
"""Quantity strings converted lately, by unit. A cluster's pods repeat a few dozen quantity texts, and
the extender reads every pod again on each watch event: parsing them was ~5 % of its CPU per pod.
Only successes are kept, and the table is emptied when full, so no input can grow it."""


def _convert(value: str | int | float, divisor: int, unit: str, saturate: bool, whole: bool = False) -> int:
    """``ceil(nano / divisor)`` (or exactly, with ``whole``), refused when negative and limited to
    :data:`QUANTITY_LIMIT`."""
    key = (value, divisor, saturate, whole) if type(value) is str else None
    if key is not None:
        hit = _CONVERTED.get(key)
        if hit is not None:
            return hit
    result = _converted(value, divisor, unit, saturate, whole)
    if key is not None:
        if len(_CONVERTED) >= _CONVERTED_MAX:
            _CONVERTED.clear()
        _CONVERTED[key] = result
    return result


def _converted(value: str | int | float, divisor: int, unit: str, saturate: bool, whole: bool) -> int:
    q = parse_quantity(value)
    if q.negative:
        raise QuantityError(f"{clip(value)} must not be negative")
    nano = q.nano()
    if nano is None:
        result = QUANTITY_LIMIT
    elif whole:
        if nano % divisor:
            raise QuantityError(f"{clip(value)} must be a whole number")
        result = nano // divisor
    else:
        result = -(-nano // divisor)
    if result >= QUANTITY_LIMIT:
        if saturate:
            return QUANTITY_LIMIT
        raise QuantityTooLarge(f"{clip(value)} is unreasonably large (at most 2**53 - 1{' ' + unit if unit else ''})")
    return result


def cpu_milli(value: str | int | float, *, saturate: bool = False) -> int:
    """CPU quantity → millicores, rounded up like Kubernetes (``"1.5"`` → 1500, ``"250m"`` → 250)."""
    return _convert(value, _NANO // 1000, "millicores", saturate)


def memory_bytes(value: str | int | float, *, saturate: bool = False) -> int:
    """Memory quantity (``"16Gi"``, ``"512M"``, bytes) → bytes, rounded up."""
    return _convert(value, _NANO, "bytes", saturate)


def memory_mib(value: str | int | float, *, saturate: bool = False) -> int:
    """Memory quantity (bytes, ``"16Gi"``, ``"512M"``) → MiB, rounded up."""
    return _convert(value, _NANO << 20, "MiB", saturate)


def count(value: str | int | float, *, saturate: bool = False) -> int:
    """An integer count quantity (extended resources such as ``nvidia.com/gpu``, the gpu-milli
    annotation): ``"8"``, ``"1k"``; ``"1.5"`` and ``"500m"`` are refused."""
    return _convert(value, _NANO, "", saturate, whole=True)


def amount_text(amount: int, unit: str = "") -> str:
    """``"1500m"``; a saturated amount reads ``"more than any node holds"`` instead of 2**53."""
    return "more than any node holds" if amount >= QUANTITY_LIMIT else f"{amount}{unit}"
