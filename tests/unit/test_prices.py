"""Node prices: every openb model priced, the published rates reproduced, nodes priced by with_prices."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.policy.cluster import NodeSpec
from rlsched.policy.dynamic.prices import PriceTable, gcp_us_central1, with_prices
from rlsched.policy.trace import read_openb_nodes

OPENB_MODELS = {"A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"}
"""The models of openb_node_list_all_node.csv (its README: G2 549 nodes, T4 404, ...)."""


def test_every_openb_model_has_a_price() -> None:
    prices = gcp_us_central1()
    assert OPENB_MODELS <= set(prices)
    assert all(price > 0 for price in prices.values())


def test_every_node_of_the_openb_list_is_priced(openb_dir: Path) -> None:
    nodes = read_openb_nodes(openb_dir / "openb_node_list_all_node.csv")
    assert {n.gpu_model for n in nodes if n.gpu_count} <= OPENB_MODELS
    priced = with_prices(nodes, PriceTable())
    assert len(priced) == len(nodes)
    assert all(p.price > 0 for p in priced)


def test_quoted_gpu_prices() -> None:
    # cloud.google.com/compute/gpus-pricing, us-central1, via SkyPilot's gcp_data/pricing/gpu.csv
    prices = gcp_us_central1()
    assert prices["P100"] == 1.46
    assert prices["T4"] == 0.35
    assert prices["V100M16"] == 2.48


@pytest.mark.parametrize(
    ("vcpus", "gib", "published"),
    [
        (1, 3.75, 0.04749975),  # n1-standard-1
        (96, 360, 4.559976),  # n1-standard-96
        (2, 13, 0.118303),  # n1-highmem-2
        (96, 86.4, 3.4007328),  # n1-highcpu-96
    ],
)
def test_vcpu_and_memory_rates_reproduce_published_n1_prices(vcpus: int, gib: float, published: float) -> None:
    table = PriceTable()
    price = table.price_per_hour("", 0, vcpus * 1000, round(gib * 1024))
    assert price == pytest.approx(published, rel=1e-4)


def test_price_adds_cards_cpu_and_memory() -> None:
    table = PriceTable()
    price = table.price_per_hour("G2", 8, 96_000, 393_216)  # an openb G2 node
    assert price == pytest.approx(8 * 2.48 + 96 * 0.031611 + 384 * 0.004237)
    assert table.price_per_hour("T4", 0, 0, 0) == 0.0


def test_cpu_only_node_ignores_model_and_unknown_gpu_model_fails_loudly() -> None:
    table = PriceTable()
    assert table.price_per_hour("", 0, 32_000, 262_144) == pytest.approx(32 * 0.031611 + 256 * 0.004237)
    with pytest.raises(KeyError, match="H100"):
        table.price_per_hour("H100", 8, 1000, 1024)


def test_with_prices_replaces_only_the_price() -> None:
    nodes = [
        NodeSpec("a", 32_000, 131_072, gpu_count=4, gpu_model="V100M16", labels={"zone": "x"}),
        NodeSpec("b", 16_000, 65_536),
    ]
    table = PriceTable(gpu_per_hour={"V100M16": 1.0}, vcpu_per_hour=0.0, memory_gib_per_hour=0.0)
    priced = with_prices(nodes, table)
    assert [p.price for p in priced] == [4.0, 0.0]
    assert priced[0].labels == {"zone": "x"}
    assert priced[0].name == "a" and priced[0].cpu_milli == 32_000
    assert nodes[0].price == 1.0  # the input is left as it was


def test_negative_prices_rejected() -> None:
    with pytest.raises(ValueError, match="T4"):
        PriceTable(gpu_per_hour={"T4": -1.0})
    with pytest.raises(ValueError):
        PriceTable(vcpu_per_hour=-0.1)
