"""What a node costs per hour: GPU cards by model, plus its vCPUs and memory.

The living cluster charges every node its price for the time it is busy, so a policy can trade
packing against cost. A price has to come from a published list, not a guess, and it has to cover
every model in the openb node list (P100, T4, V100M16, V100M32, A10, G2, G3). One provider is used
for all three parts so they are comparable: Google Compute Engine, region us-central1, on-demand,
where GPUs are billed per card and vCPUs and memory per unit, separately (the N1 family's resource
based pricing). Models that list does not sell are priced as a named card, and each such choice is
stated in :func:`gcp_us_central1` and docs/usage-model.md.

Sources:

- GPUs: cloud.google.com/compute/gpus-pricing, as transcribed for us-central1 in SkyPilot's catalog,
  github.com/skypilot-org/skypilot ``sky/clouds/service_catalog/data_fetchers/gcp_data/pricing/gpu.csv``
  (commit 7d7c42f807d4df673e45594bfd9c126f77078cb2): T4 0.35, P4 0.60, P100 1.46, V100 2.48,
  A100 2.934, K80 0.45 USD per GPU-hour.
- vCPU and memory: the N1 rates that the same catalog's
  ``gcp_data/pricing/vm.csv`` (commit 1eb6c27c3eda538afbc4d9703df228e21c2f8ef7) implies for
  us-central1: n1-standard-1 (1 vCPU, 3.75 GB) 0.04749975 and n1-highcpu-2 (2 vCPU, 1.8 GB)
  0.0708486 USD/h solve to 0.031611 per vCPU-hour and 0.004237 per GB-hour (GB = GiB on that page);
  the rest of the N1 rows reproduce from these two rates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..cluster import NodeSpec

MIB_PER_GIB = 1024
MILLI_PER_CPU = 1000


def gcp_us_central1() -> dict[str, float]:
    """USD per GPU-hour for the openb models, on-demand, Google Compute Engine us-central1.

    Quoted: P100 1.46, T4 0.35, V100 2.48 (GCP's V100 is the 16 GB card).
    Assumptions (no price published for the card as named):

    - ``V100M32`` (V100 32 GB): priced as the V100 on the list; GCP sells only the 16 GB card.
    - ``A10``: not on GCP's list; priced as the V100. Only 2 of openb's 1,523 nodes (one card each)
      carry it, so the choice barely moves any cost.
    - ``G2`` and ``G3``: "undisclosed internal GPU codes" (the openb README in
      github.com/alibaba/clusterdata, cluster-trace-gpu-v2023); priced as the V100, the dearest card
      of the openb cluster, because G2 and G3 nodes are 8-GPU servers like its 8-GPU V100M32 ones
      (96 cores, 768 GiB; G2 is 96 cores and 384 GiB, G3 128 cores and 768 GiB).
    """
    v100 = 2.48
    return {"P100": 1.46, "T4": 0.35, "V100M16": v100, "V100M32": v100, "A10": v100, "G2": v100, "G3": v100}


@dataclass(frozen=True)
class PriceTable:
    """Prices per hour: per GPU by model, per vCPU, per GiB of memory (defaults: GCP us-central1, USD)."""

    gpu_per_hour: Mapping[str, float] = field(default_factory=gcp_us_central1)
    """Price of one card per hour, by the node list's model name (see :func:`gcp_us_central1`)."""
    vcpu_per_hour: float = 0.031611
    """Price of one vCPU per hour; GCP N1, us-central1 (module docstring)."""
    memory_gib_per_hour: float = 0.004237
    """Price of one GiB of memory per hour; GCP N1, us-central1 (module docstring)."""

    def __post_init__(self) -> None:
        if self.vcpu_per_hour < 0 or self.memory_gib_per_hour < 0:
            raise ValueError("vCPU and memory prices must not be negative")
        negative = sorted(model for model, price in self.gpu_per_hour.items() if price < 0)
        if negative:
            raise ValueError(f"GPU prices must not be negative: {', '.join(negative)}")

    def price_per_hour(self, model: str, gpus: int, cpu_milli: int, memory_mib: int) -> float:
        """A node's price per hour: its cards at the model's price, plus its vCPUs and memory.

        Raises KeyError naming the model when a node with GPUs has a model the table does not price
        (add it to ``gpu_per_hour``; a silent default would hide a missing price).
        """
        if gpus < 0 or cpu_milli < 0 or memory_mib < 0:
            raise ValueError("gpus, cpu and memory must not be negative")
        gpu_price = 0.0
        if gpus > 0:
            if model not in self.gpu_per_hour:
                known = ", ".join(sorted(self.gpu_per_hour))
                raise KeyError(f"no price for GPU model {model!r} (priced: {known}); add it to PriceTable.gpu_per_hour")
            gpu_price = gpus * self.gpu_per_hour[model]
        cpu_price = cpu_milli / MILLI_PER_CPU * self.vcpu_per_hour
        memory_price = memory_mib / MIB_PER_GIB * self.memory_gib_per_hour
        return gpu_price + cpu_price + memory_price


def with_prices(nodes: Sequence[NodeSpec], table: PriceTable) -> list[NodeSpec]:
    """The nodes with ``price`` set from the table (per hour, the table's currency)."""
    return [
        replace(node, price=table.price_per_hour(node.gpu_model, node.gpu_count, node.cpu_milli, node.memory_mib))
        for node in nodes
    ]
