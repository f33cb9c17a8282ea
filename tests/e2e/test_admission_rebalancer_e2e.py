"""The rebalancer's rights against the real kube-apiserver: the chart rendered with
``operator.rebalancer.enabled`` (its RBAC and the admission policy's eviction exception), then, with a
bound token of the operator's ServiceAccount:

- the rebalancer's own call (``rlsched.operator.kube.Kube.evict_pod``: policy/v1 Eviction with the
  UID precondition) passes in a watched namespace, in dry-run (the pod stays) and for real;
- its cluster reads (``Kube.list_all``: nodes and pods everywhere) pass;
- an eviction in a namespace the operator does not watch is an RBAC 403, and a pod delete still is;
- with RBAC widened by mistake (delete on pods), the admission policy still denies the delete: the
  exception is for evictions only.

Reuses tests/e2e/test_admission_e2e.py's helpers, with namespaces, release and policy names of its
own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from test_admission_e2e import (
    TOOLS_BIN,
    Env,
    Names,
    applied_chart,
    denied_by_policy,
    forbidden_by_rbac,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)

NAMES = Names("rlsched-rbl", "rl-rbl")
NS, WATCHED, UNWATCHED = NAMES.ns, NAMES.watched, NAMES.unwatched


@pytest.fixture(scope="module")
def env(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if not (TOOLS_BIN / "helm").exists():
        pytest.skip(f"helm missing in {TOOLS_BIN} (run hack/build-tools.sh)")
    values = {"operator": {"watchNamespaces": [NS, WATCHED], "rebalancer": {"enabled": True}}}
    pods = {ns: ["victim", "moved"] for ns in (WATCHED, UNWATCHED)}
    yield from applied_chart(cluster, tmp_path_factory.mktemp("rebalancer-admission"), NAMES, values, pods)


def kube(env: Env) -> Any:
    from rlsched.operator.kube import Kube, load_configuration

    return Kube(load_configuration(str(env.operator_kubeconfig), None))


def test_the_rebalancers_evictions_and_reads_pass(env: Env) -> None:
    k = kube(env)
    try:
        uid = env.pod(WATCHED, "moved")["metadata"]["uid"]
        asyncio.run(k.evict_pod(WATCHED, "moved", uid, dry_run=True))
        assert not env.pod(WATCHED, "moved")["metadata"].get("deletionTimestamp")  # dry run: nothing changed
        nodes = asyncio.run(k.list_all("nodes"))
        pods = asyncio.run(k.list_all("pods", field_selector="status.phase!=Succeeded"))
        assert nodes and {p["metadata"]["namespace"] for p in pods} >= {WATCHED, UNWATCHED}
        asyncio.run(k.evict_pod(WATCHED, "moved", uid))
    finally:
        k.close()
    gone = lambda: env.admin("get", "pod", "moved", "-n", WATCHED, check=False).returncode != 0  # noqa: E731
    wait_for(gone, 60, "the evicted pod to go")


def test_evictions_elsewhere_and_deletes_are_refused(env: Env) -> None:
    from rlsched.operator.kube import KubeError

    uid = env.pod(UNWATCHED, "moved")["metadata"]["uid"]
    k = kube(env)
    try:
        with pytest.raises(KubeError) as err:
            asyncio.run(k.evict_pod(UNWATCHED, "moved", uid))
    finally:
        k.close()
    assert err.value.status == 403 and 'cannot create resource "pods/eviction"' in str(err.value), err.value
    forbidden_by_rbac(env.as_operator("delete_namespaced_pod", "victim", WATCHED), 'delete resource "pods"', NAMES.user)
    assert not env.pod(UNWATCHED, "moved")["metadata"].get("deletionTimestamp")


def test_the_exception_is_for_evictions_only(env: Env) -> None:
    widened = NAMES.widened
    env.admin("create", "clusterrole", widened, "--verb=delete", "--resource=pods")
    env.admin("create", "clusterrolebinding", widened, f"--clusterrole={widened}", f"--serviceaccount={NS}:{NAMES.sa}")

    def past_rbac() -> tuple[int, str] | None:
        answer = env.as_operator("delete_namespaced_pod", "victim", WATCHED)
        return None if "cannot delete" in answer[1] else answer

    denied_by_policy(
        wait_for(past_rbac, 30, "the widened RBAC to apply"), "may only update pods' rlsched.io/", NAMES.policy
    )
    assert not env.pod(WATCHED, "victim")["metadata"].get("deletionTimestamp")
