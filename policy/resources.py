"""Units and Kubernetes resource quantities.

The domain model counts CPU in millicores, memory in MiB and GPU in *milli-cards*: one card is
:data:`MILLI_PER_CARD` milli. A pod asks either for whole cards (``num_gpu`` cards of 1000 milli)
or for a share of one card (``num_gpu == 1`` and ``gpu_milli < 1000``).
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MILLI_PER_CARD = 1000
"""GPU milli in one card."""

_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


class QuantityError(ValueError):
    """A Kubernetes resource quantity that cannot be parsed."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity (``"500m"``, ``"2"``, ``"16Gi"``, ``"1e3"``) into a Decimal.

    Raises :class:`QuantityError` with the offending text when it is not a quantity.
    """
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity such as '500m' or '16Gi', got {value!r}")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity such as '500m' or '16Gi', got {type(value).__name__}")
    text = value.strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity (examples: '500m', '2', '16Gi')")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise QuantityError(f"{value!r} is not a Kubernetes quantity") from exc


def cpu_milli(value: str | int | float) -> int:
    """CPU quantity → millicores, rounded up like Kubernetes (``"1.5"`` → 1500, ``"250m"`` → 250)."""
    milli = parse_quantity(value) * 1000
    return int(milli.to_integral_value(rounding="ROUND_CEILING"))


def memory_mib(value: str | int | float) -> int:
    """Memory quantity (bytes, ``"16Gi"``, ``"512M"``) → MiB, rounded up."""
    mib = parse_quantity(value) / (2**20)
    return int(mib.to_integral_value(rounding="ROUND_CEILING"))


def count(value: str | int | float) -> int:
    """An integer count quantity (extended resources such as ``nvidia.com/gpu``)."""
    parsed = parse_quantity(value)
    if parsed != parsed.to_integral_value():
        raise QuantityError(f"{value!r} must be a whole number")
    return int(parsed)
