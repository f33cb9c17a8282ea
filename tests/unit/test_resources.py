"""Kubernetes quantities → our units (millicores, bytes, MiB, counts): the grammar of
k8s.io/apimachinery's resource.Quantity, bounded, with saturation for requests no node could hold."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.policy.resources import (
    MAX_QUANTITY_CHARS,
    MILLI_PER_CARD,
    QUANTITY_LIMIT,
    Quantity,
    QuantityError,
    QuantityTooLarge,
    amount_text,
    clip,
    count,
    cpu_milli,
    memory_bytes,
    memory_mib,
    parse_quantity,
)


def exact(q: Quantity) -> Fraction:
    """The value a (small) parsed quantity stands for."""
    value = Fraction(int(q.digits or "0")) * Fraction(10) ** q.exp10 * 2**q.exp2
    return -value if q.negative else value


def test_milli_per_card() -> None:
    assert MILLI_PER_CARD == 1000


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2", Fraction(2)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("16Gi", Fraction(16 * 2**30)),
        ("512M", Fraction(512 * 10**6)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("1e-3", Fraction(1, 1000)),
        ("1e+3", Fraction(1000)),
        ("1E", Fraction(10**18)),  # E alone is exa, like Kubernetes
        ("4Ki", Fraction(4096)),
        ("1.", Fraction(1)),  # <digits>.  is in the grammar
        (".5", Fraction(1, 2)),  # .<digits> too
        ("+7", Fraction(7)),
        ("-1", Fraction(-1)),
        ("-0", Fraction(0)),
        ("007.500", Fraction(15, 2)),
        ("3n", Fraction(3, 10**9)),
        ("2u", Fraction(2, 10**6)),
        (3, Fraction(3)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_quantity(text, expected) -> None:
    assert exact(parse_quantity(text)) == expected


@pytest.mark.parametrize(
    "bad",
    [
        "12x",
        "",
        "1.2.3",
        "Gi",
        "5 Gi",
        "1ki",
        "1e",
        "1e2.5",
        "1Ki3",
        "+",
        "-",
        ".",
        "e3",
        "1ee3",
        "1E+",
        "  4Ki ",
        " 500 ",
        "500\n",
        "1_000",
        "５００",
        "٣",
        "inf",
        "nan",
        "0x10",
        "1" * (MAX_QUANTITY_CHARS + 1),
        True,
        None,
        [1],
        float("inf"),
        float("nan"),
        10**100,
    ],
)
def test_parse_quantity_rejects(bad) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(bad)
    assert "quantity" in str(info.value) or "characters" in str(info.value)
    assert len(str(info.value)) < 140


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1.5", 1500),  # cores → millicores
        ("250m", 250),
        ("0.1m", 1),  # rounded up, like Kubernetes
        ("96", 96000),
        (2, 2000),
        ("1e-999999999", 1),  # a positive value below 1n is 1n for the API server, so 1m here
        ("0", 0),
    ],
)
def test_cpu_milli(text, expected) -> None:
    assert cpu_milli(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("16Gi", 16384),
        ("512Mi", 512),
        ("512M", 489),  # 512e6 / 2**20 = 488.28 → rounded up
        ("1", 1),  # one byte still takes a MiB
        (2**20, 1),
    ],
)
def test_memory_mib(text, expected) -> None:
    assert memory_mib(text) == expected


def test_memory_bytes() -> None:
    assert memory_bytes("16Gi") == 16 * 2**30
    assert memory_bytes("1.5k") == 1500
    assert memory_bytes("0.5") == 1


def test_count() -> None:
    assert count("8") == 8
    assert count(2) == 2
    assert count("1k") == 1000  # the same grammar as any quantity
    for bad in ("1.5", "500m", "0.0000000001"):
        with pytest.raises(QuantityError, match="whole number"):
            count(bad)


@pytest.mark.parametrize("fn", [cpu_milli, memory_bytes, memory_mib, count])
@pytest.mark.parametrize("text", ["-1", "-1e5000", "-1e999999999", "-0.5m"])
def test_negative_quantities_are_refused(fn, text) -> None:
    with pytest.raises(QuantityError, match="must not be negative"):
        fn(text)


@pytest.mark.parametrize("fn", [cpu_milli, memory_bytes, memory_mib, count])
@pytest.mark.parametrize(
    "text",
    [
        "1e999999",
        "1e400000",
        "1e5000",
        "1e999999999",
        "16384Ei",
        "9" * MAX_QUANTITY_CHARS,
        "1e99999999999999999999999999999999999999999999999999999999999",
    ],
)
def test_huge_quantities_are_refused_or_saturate(fn, text) -> None:
    with pytest.raises(QuantityTooLarge) as info:
        fn(text)
    assert "unreasonably large" in str(info.value) and len(str(info.value)) < 120
    assert fn(text, saturate=True) == QUANTITY_LIMIT


def test_limit_boundary() -> None:
    assert cpu_milli(f"{QUANTITY_LIMIT - 1}m") == QUANTITY_LIMIT - 1
    with pytest.raises(QuantityTooLarge):
        cpu_milli(f"{QUANTITY_LIMIT}m")
    assert count(str(QUANTITY_LIMIT - 1)) == QUANTITY_LIMIT - 1
    assert count(str(QUANTITY_LIMIT + 1), saturate=True) == QUANTITY_LIMIT


def test_clip_never_renders_huge_values() -> None:
    assert clip("1e999999") == "'1e999999'"
    long = clip("1" * 5000)
    assert long.startswith("'11111111111111111111'…") and "5000 characters" in long and len(long) < 50
    assert "digits" in clip(10**5000) and len(clip(10**5000)) < 50
    assert clip(12) == "12" and clip([1]) == "a list"


def test_amount_text() -> None:
    assert amount_text(1500, "m") == "1500m"
    assert amount_text(QUANTITY_LIMIT, "m") == "more than any node holds"


def _reference_cpu_milli(value: Fraction) -> int:
    """The API server's round-up to 1n, then up to millicores."""
    nano = math.ceil(value * 10**9)
    return min(math.ceil(Fraction(nano, 10**6)), QUANTITY_LIMIT)


_SUFFIXES = {
    "": 1,
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


@settings(max_examples=300, deadline=None)
@given(
    whole=st.text("0123456789", max_size=12),
    frac=st.none() | st.text("0123456789", max_size=12),
    suffix=st.sampled_from(sorted(_SUFFIXES)) | st.integers(-40, 40).map(lambda e: f"e{e}"),
)
def test_agrees_with_exact_arithmetic(whole, frac, suffix) -> None:
    text = whole + ("" if frac is None else "." + frac) + suffix
    if not whole and not frac:
        with pytest.raises(QuantityError):
            parse_quantity(text)
        return
    value = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    value *= Fraction(10) ** int(suffix[1:]) if suffix.startswith("e") else _SUFFIXES[suffix]
    assert exact(parse_quantity(text)) == value
    assert cpu_milli(text, saturate=True) == _reference_cpu_milli(value)


def test_remembered_conversions_answer_as_a_fresh_parse_and_errors_are_not_remembered():
    from rlsched.policy import resources

    resources._CONVERTED.clear()
    assert cpu_milli("1500m") == cpu_milli("1500m") == 1500
    assert memory_bytes("1500m") == 2  # the same text in another unit is another entry
    with pytest.raises(QuantityError):
        count("1500m")
    assert ("1500m", 10**9, False, True) not in resources._CONVERTED
    assert cpu_milli("9" * 30, saturate=True) == QUANTITY_LIMIT
    with pytest.raises(QuantityError):  # a saturated reading is not served to a caller that refuses it
        cpu_milli("9" * 30)


def test_remembered_conversions_stay_bounded():
    from rlsched.policy import resources

    resources._CONVERTED.clear()
    for i in range(resources._CONVERTED_MAX + 10):
        assert cpu_milli(f"{i}m") == i
    assert len(resources._CONVERTED) <= resources._CONVERTED_MAX
