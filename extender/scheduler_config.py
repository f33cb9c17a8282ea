"""The KubeSchedulerConfiguration we recommend — the one source the Helm chart and the e2e tests use.

``scheduler_config(...)`` returns it as a dict, ``render(...)`` as YAML; ``extender/scheduler-config.yaml``
is ``render()`` with the defaults, committed for tools that cannot run Python (a unit test keeps it
in step), and ``rlsched extender --print-scheduler-config`` prints it with the flags applied.

What it does and why (docs/extender.md, "Decisions that survive kube-scheduler"):

- one profile, ``rl-scheduler``, in a kube-scheduler of its own, with its own leader-election lease
  (sharing the default scheduler's lease would make it wait forever);
- ``percentageOfNodesToScore: 0``, kube-scheduler's adaptive default: on a large cluster the policy
  chooses among the first feasible nodes kube-scheduler finds (all of them up to 100 nodes, 41 % of
  1,213). Measured (docs/benchmarks.md, "percentageOfNodesToScore"): at 1,000 nodes it takes the
  backlog from half of stock kube-scheduler's throughput to three quarters (0.50 → 0.76, means of
  four runs), for 0.04 points more unallocated GPU on the openb FGD protocol and none measurable in
  the living cluster; 100 sends every feasible node to the policy where placement matters more than
  throughput;
- every *score* and *preScore* plugin off: the extender's score is the only one, so kube-scheduler's
  sum cannot overturn the policy's choice (and with ``topK: 1`` filter already leaves one node, which
  kube-scheduler binds without scoring at all);
- a dominant extender weight anyway (1000: one step of the extender's 0..10 outweighs the default
  plugins' maximum of 1,200 if someone turns them back on);
- the extender binds (so the card choice is recorded before the pod lands) and preempts (so victims
  are only taken where they free the cards the pod needs); it is not ``ignorable``: without it GPU
  cards would be handed out unchecked;
- ``nodeCacheCapable: true`` (names only; full v1.Node lists cost ~70 ms per call at 1,000 nodes);
- ``NodeResourcesFit`` ignores ``rlsched.io/gpu-milli`` (no node advertises it; the extender checks
  shares per card). ``managedResources`` is deliberately unset: it would stop CPU-only pods of the
  profile from reaching the policy;
- optionally mutual TLS (``tls``: where the extender is not a loopback sidecar): an ``https`` URL,
  ``enableHTTPS: true`` and ``tlsConfig`` with kube-scheduler's client certificate and the CA that
  signed the extender's serving certificate (the extender's ``server.tls``). Without it the output is
  unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from .settings import GpuConventions

DEFAULT_URL = "http://127.0.0.1:8888"
"""The extender as a sidecar of kube-scheduler, on loopback."""


@dataclass(frozen=True)
class ClientTls:
    """kube-scheduler's side of the extender's mutual TLS (paths as kube-scheduler sees them)."""

    cert_file: str
    """kube-scheduler's client certificate (signed by the CA in the extender's ``server.tls.clientCaFile``)."""
    key_file: str
    """Its private key."""
    ca_file: str
    """The CA that signed the extender's serving certificate (``server.tls.certFile``)."""
    server_name: str | None = None
    """Name to verify in the extender's certificate when the URL's host is not in it."""


def scheduler_config(
    url: str = DEFAULT_URL,
    scheduler_name: str = "rl-scheduler",
    weight: int = 1000,
    node_cache_capable: bool = True,
    lease_name: str | None = None,
    lease_namespace: str = "kube-system",
    http_timeout: str = "10s",
    kubeconfig: str | None = None,
    leader_elect: bool = True,
    gpu: GpuConventions | None = None,
    keep_score_plugins: bool = False,
    tls: ClientTls | None = None,
    percentage_of_nodes_to_score: int = 0,
) -> dict[str, Any]:
    """The recommended configuration as a dict (``kubescheduler.config.k8s.io/v1``).

    ``tls``: call the extender over mutual TLS (``url`` must be ``https://``).
    ``percentage_of_nodes_to_score``: 0 (kube-scheduler's adaptive default), or 1-100: 100 sends every
    feasible node to the policy, for the best placement at the cost of a longer scheduling cycle on
    large clusters (docs/benchmarks.md, "percentageOfNodesToScore")."""
    if tls is not None and not url.startswith("https://"):
        raise ValueError(f"extender URL {url!r}: mutual TLS needs an https:// URL")
    if not 0 <= percentage_of_nodes_to_score <= 100:
        raise ValueError(f"percentageOfNodesToScore {percentage_of_nodes_to_score}: must be 0 (adaptive) to 100")
    gpu = gpu or GpuConventions()
    plugins: dict[str, Any] = {}
    if not keep_score_plugins:
        plugins = {"preScore": {"disabled": [{"name": "*"}]}, "score": {"disabled": [{"name": "*"}]}}
    profile: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "percentageOfNodesToScore": percentage_of_nodes_to_score,
        "plugins": plugins,
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {"ignoredResources": [gpu.gpu_milli_resource]},
            }
        ],
    }
    if not plugins:
        del profile["plugins"]
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {
            "leaderElect": leader_elect,
            "resourceLock": "leases",
            "resourceName": lease_name or scheduler_name,
            "resourceNamespace": lease_namespace,
        },
        "percentageOfNodesToScore": percentage_of_nodes_to_score,
        "profiles": [profile],
        "extenders": [
            {
                "urlPrefix": url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "preemptVerb": "preempt",
                "bindVerb": "bind",
                "weight": weight,
                "enableHTTPS": url.startswith("https"),
                "httpTimeout": http_timeout,
                "nodeCacheCapable": node_cache_capable,
                "ignorable": False,
            }
        ],
    }
    if tls is not None:
        tls_config = {"certFile": tls.cert_file, "keyFile": tls.key_file, "caFile": tls.ca_file}
        if tls.server_name:
            tls_config["serverName"] = tls.server_name
        config["extenders"][0]["tlsConfig"] = tls_config
    if kubeconfig:
        config["clientConnection"] = {"kubeconfig": kubeconfig}
    return config


HEADER = """\
# KubeSchedulerConfiguration for kube-rl-scheduler, rendered by
# rlsched.extender.scheduler_config.render() — edit that function, not this file
# (tests/unit/test_extender_config.py checks they agree). Why each setting: docs/extender.md.
"""


def render(**kwargs: Any) -> str:
    """The configuration as YAML, with a header saying where it comes from."""
    return HEADER + yaml.safe_dump(scheduler_config(**kwargs), sort_keys=False, default_flow_style=False)
