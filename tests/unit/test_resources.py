"""Kubernetes quantities → our units (millicores, MiB, counts)."""
from __future__ import annotations

from decimal import Decimal

import pytest

from rlsched.policy.resources import MILLI_PER_CARD, QuantityError, count, cpu_milli, memory_mib, parse_quantity


def test_milli_per_card() -> None:
    assert MILLI_PER_CARD == 1000


@pytest.mark.parametrize("text, expected", [
    ("2", Decimal(2)),
    ("500m", Decimal("0.5")),
    ("1.5", Decimal("1.5")),
    ("16Gi", Decimal(16 * 2**30)),
    ("512M", Decimal(512 * 10**6)),
    ("1e3", Decimal(1000)),
    ("  4Ki ", Decimal(4096)),
    (3, Decimal(3)),
    (0.25, Decimal("0.25")),
    ("-1", Decimal(-1)),
])
def test_parse_quantity(text, expected) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("bad", ["12x", "", "1.2.3", "Gi", "5 Gi", "1ki", True, None, [1]])
def test_parse_quantity_rejects(bad) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(bad)
    assert "quantity" in str(info.value)


@pytest.mark.parametrize("text, expected", [
    ("1.5", 1500),      # cores → millicores
    ("250m", 250),
    ("0.1m", 1),        # rounded up, like Kubernetes
    ("96", 96000),
    (2, 2000),
])
def test_cpu_milli(text, expected) -> None:
    assert cpu_milli(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("16Gi", 16384),
    ("512Mi", 512),
    ("512M", 489),      # 512e6 / 2**20 = 488.28 → rounded up
    ("1", 1),           # one byte still takes a MiB
    (2**20, 1),
])
def test_memory_mib(text, expected) -> None:
    assert memory_mib(text) == expected


def test_count() -> None:
    assert count("8") == 8
    assert count(2) == 2
    for bad in ("1.5", "500m"):
        with pytest.raises(QuantityError, match="whole number"):
            count(bad)
