"""Who may call the extender, against the real API server (hack/local-cluster.sh) and kube-scheduler.

- The status listener as ``rlsched extender`` runs by default (``auth.mode: kubernetes``): /decisions
  and /status answer 401 without a token and with a forged one, 403 to a real ServiceAccount token
  without the grant (a SubjectAccessReview for the non-resource URL denies), 200 to a token bound to
  the ClusterRole ``rlsched-extender-reader``; revoking the binding turns 200 into 403 once the cache
  TTL has passed, and granting it again back; /healthz, /readyz and (by default) /metrics stay open.
- Audience-bound tokens (``auth.audiences``): a token made with ``kubectl create token SA --audience
  rlsched-extender`` is accepted by the extender's status port (and by the operator's client reading
  it from a file) and refused (401) by the API server itself, so one read off the plain-HTTP port
  cannot be replayed there; the API server's own tokens are accepted beside it, and refused with
  ``auth.apiServerAudience: false``.
- The verbs over mutual TLS: kube-scheduler (the real binary) calls filter and bind over HTTPS with
  its client certificate (``tlsConfig`` rendered by ``scheduler_config``); a pod is bound with its GPU
  cards; a client without a certificate from the CA is refused at the handshake.
- kube-scheduler's /debug/pprof (the benchmark's CPU profiles) answers only when the harness opens it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import ssl
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rlstack", REPO_ROOT / "hack" / "rlstack.py")
rlstack = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("rlstack", rlstack)
_spec.loader.exec_module(rlstack)  # type: ignore[union-attr]
rlstack = sys.modules["rlstack"]

SUITE = f"auth-{uuid.uuid4().hex[:6]}"
NS = f"rlsched-e2e-{SUITE}"


def get(url: str, token: str | None = None) -> tuple[int, dict[str, str], dict[str, Any]]:
    """(status, headers, JSON body) of a GET, with ``Authorization: Bearer token`` when given."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            status, headers, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers), exc.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = {"text": raw.decode(errors="replace")}
    return status, headers, body


@pytest.fixture(scope="module")
def local(cluster: Any) -> Any:
    if getattr(cluster, "external", False):
        pytest.skip("needs the local control plane")
    return rlstack.LocalCluster(cluster.state_dir)


def test_status_listener_answers_only_tokens_the_api_server_allows(local: Any) -> None:
    ext = rlstack.Extender(local, name=f"rlsched-extender-{SUITE}")
    # Short cache TTLs, so that a revoked grant shows within seconds.
    ext.start_with(settings={"auth": {"cacheTtlS": 1.0, "negativeCacheTtlS": 1.0}})
    reader = f"rlsched-e2e-reader-{SUITE}"
    try:
        base = ext.status_url
        for path in ("/healthz", "/readyz", "/metrics"):
            assert get(base + path)[0] == 200, path
        for path in ("/decisions", "/status"):
            status, headers, body = get(base + path)
            assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer"), (status, headers)
        granted = rlstack.service_account_token(local, reader).read_text().strip()
        nobody = rlstack.service_account_token(local, f"rlsched-e2e-nobody-{SUITE}", grant=False).read_text().strip()
        operator = rlstack.service_account_token(local, rlstack.OPERATOR_IDENTITY).read_text().strip()
        forged = granted[:-4] + ("AAAA" if not granted.endswith("AAAA") else "BBBB")  # a bad signature
        status, _, body = get(base + "/decisions", forged)
        assert status == 401 and "not accepted" in body["Error"], body
        status, _, body = get(base + "/decisions", nobody)
        assert status == 403 and f"system:serviceaccount:kube-system:rlsched-e2e-nobody-{SUITE}" in body["Error"], body
        for token in (granted, operator):
            status, _, body = get(base + "/decisions?after=0&limit=10", token)
            assert status == 200 and isinstance(body["records"], list), body
            assert get(base + "/status", token)[0] == 200
        assert get(base + "/decisions?limit=1e3", granted)[2]["Error"].startswith("limit: ")

        # Revoke the grant: denied once the cached answer has expired; grant it again: allowed.
        local.kubectl("delete", "clusterrolebinding", f"{rlstack.READER_ROLE}-{reader}")
        rlstack.wait_for(lambda: get(base + "/decisions", granted)[0] == 403, 30, "the revoked token to be refused")
        local.apply(rlstack.reader_rbac(reader))
        rlstack.wait_for(lambda: get(base + "/decisions", granted)[0] == 200, 30, "the re-granted token to be served")

        metrics = get(base + "/metrics")[2]["text"]
        counts = {
            r: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            for r in ("allowed", "unauthenticated", "forbidden", "unavailable")
            if line.startswith(f'rlsched_extender_auth_requests_total{{result="{r}"}}')
        }
        assert counts["allowed"] >= 5 and counts["unauthenticated"] >= 3 and counts["forbidden"] >= 2
        assert counts["unavailable"] == 0
        assert 'rlsched_extender_auth_reviews_total{kind="token",result="ok"}' in metrics
        log = ext.log_path.read_text(errors="replace")
        assert '"level":"error"' not in log
        for token in (granted, nobody, operator, forged):
            assert token not in log  # tokens are never logged
    finally:
        ext.stop()
        local.kubectl(
            "delete", "clusterrolebinding", f"{rlstack.READER_ROLE}-{reader}", "--ignore-not-found", check=False
        )


AUDIENCE = "rlsched-extender"


def audience_token(cluster: Any, account: str) -> str:
    """A token of the ServiceAccount made for the extender's audience, as a user would make one (the
    admin's kubectl, TokenRequest API)."""
    done = cluster.kubectl("create", "token", account, "-n", "kube-system", "--audience", AUDIENCE, "--duration", "1h")
    return str(done.stdout.strip())


def test_audience_bound_tokens_read_the_status_port_and_nothing_else(cluster: Any, local: Any, tmp_path: Path) -> None:
    from rlsched.operator.extender_client import ExtenderClient

    reader = f"rlsched-e2e-aud-reader-{SUITE}"
    default = rlstack.service_account_token(local, reader).read_text().strip()  # the API server's audience
    bound = audience_token(cluster, reader)
    apiserver = ssl.create_default_context(cafile=str(local.pki / "ca.crt"))

    # The API server refuses the audience-bound token (a replay gets nothing), takes its own.
    assert rlstack.http_get(f"{local.apiserver_url}/api", context=apiserver, token=bound)[0] == 401
    assert rlstack.http_get(f"{local.apiserver_url}/api", context=apiserver, token=default)[0] == 200

    ext = rlstack.Extender(local, name=f"rlsched-extender-{SUITE}-aud")
    try:
        ext.start_with(settings={"auth": {"audiences": [AUDIENCE]}})
        for token in (bound, default):  # apiServerAudience defaults to true: Prometheus' token still works
            status, _, body = get(ext.status_url + "/decisions?after=0&limit=5", token)
            assert status == 200 and isinstance(body["records"], list), body
        status, _, body = get(
            ext.status_url + "/status", bound[:-4] + ("AAAA" if not bound.endswith("AAAA") else "BBBB")
        )
        assert status == 401 and "not accepted" in body["Error"], body

        # The operator's client reads the token from a file, as the chart's projected volume holds it.
        token_file = tmp_path / "token"
        token_file.write_text(bound + "\n")

        async def operator_reads() -> Any:
            client = ExtenderClient(ext.status_url, token_file=str(token_file))
            try:
                return await client.status()
            finally:
                await client.close()

        assert asyncio.run(operator_reads()) is not None
        ext.stop()

        # Only the extender's audience: the API server's own tokens are refused.
        ext.start_with(settings={"auth": {"audiences": [AUDIENCE], "apiServerAudience": False}})
        status, headers, body = get(ext.status_url + "/status", default)
        assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer"), (status, body)
        assert f"for audiences ['{AUDIENCE}']" in body["Error"], body
        assert get(ext.status_url + "/status", bound)[0] == 200
        metrics = get(ext.status_url + "/metrics")[2]["text"]
        assert 'rlsched_extender_auth_requests_total{result="unavailable"} 0.0' in metrics
        log = ext.log_path.read_text(errors="replace")
        assert bound not in log and default not in log  # tokens are never logged
    finally:
        ext.stop()
        local.kubectl(
            "delete", "clusterrolebinding", f"{rlstack.READER_ROLE}-{reader}", "--ignore-not-found", check=False
        )


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl missing (makes the test certificates)")
def test_kube_scheduler_calls_the_verbs_over_mutual_tls(local: Any, tmp_path: Path) -> None:
    from rlsched.extender.scheduler_config import ClientTls

    pki = rlstack.tls_pki(tmp_path / "pki")
    rogue = rlstack.tls_pki(tmp_path / "rogue", "rogue")
    scheduler_name = f"rl-{SUITE}"
    node = f"{SUITE}-node"
    ext = rlstack.Extender(local, name=f"rlsched-extender-{SUITE}-mtls")
    sched = rlstack.KubeScheduler(local, name=f"rl-kube-scheduler-{SUITE}")
    ext.start_with(
        settings={
            "kubernetes": {"schedulerName": scheduler_name},
            "server": {
                "tls": {
                    "certFile": str(pki["server_cert"]),
                    "keyFile": str(pki["server_key"]),
                    "clientCaFile": str(pki["ca"]),
                }
            },
        }
    )
    try:
        conf = rlstack.rl_scheduler_config(
            local,
            f"https://127.0.0.1:{ext.port}",
            scheduler_name=scheduler_name,
            leader_elect=False,
            tls=ClientTls(str(pki["client_cert"]), str(pki["client_key"]), str(pki["ca"])),
        )
        assert conf["extenders"][0]["enableHTTPS"] is True
        sched.start_with(conf)
        rlstack.create_nodes(local, [rlstack.kwok_node(node, 8000, 16384, 2, "T4", labels={"rlsched.io/e2e": SUITE})])
        rlstack.ensure_namespace(local, NS)
        pod = rlstack.pod_manifest(
            "mtls",
            500,
            512,
            1,
            1000,
            scheduler_name=scheduler_name,
            namespace=NS,
            node_selector={"rlsched.io/e2e": SUITE},
        )
        local.apply([pod])

        def bound() -> dict | None:
            p = json.loads(local.kubectl("get", "pod", "mtls", "-n", NS, "-o", "json").stdout)
            return p if p["spec"].get("nodeName") else None

        p = rlstack.wait_for(bound, 90, "the pod to be bound through the extender over mutual TLS")
        on, cards, milli = rlstack.card_assignment(p)  # written by the extender's bind
        assert (on, len(cards), milli) == (node, 1, 1000) and p["spec"]["nodeName"] == node
        kinds = {r["kind"] for r in ext.decisions(0, 100)["records"] if r["pod"]["name"] == "mtls"}
        assert {"filter", "bind"} <= kinds

        # Without a client certificate from the CA, the handshake fails: nobody else calls the verbs.
        body = json.dumps(
            {"PodName": "mtls", "PodNamespace": NS, "PodUID": p["metadata"]["uid"], "Node": node}
        ).encode()
        for cert in (None, rogue):
            ctx = ssl.create_default_context(cafile=str(pki["ca"]))
            if cert is not None:
                ctx.load_cert_chain(str(cert["client_cert"]), str(cert["client_key"]))
            request = urllib.request.Request(f"https://127.0.0.1:{ext.port}/bind", data=body, method="POST")
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                urllib.request.urlopen(request, timeout=10, context=ctx)
    finally:
        sched.stop()
        ext.stop()
        local.kubectl("delete", "namespace", NS, "--wait=false", "--ignore-not-found", check=False)
        local.kubectl("delete", "node", node, "--ignore-not-found", check=False)


def test_kube_scheduler_profiles_only_when_the_harness_opens_pprof(local: Any) -> None:
    """The benchmark's ``--pprof-dir`` (``KubeScheduler.start_with(profiling=True)``) reads a real Go
    CPU profile; without it the debug endpoint stays behind kube-scheduler's authorization."""
    conf = rlstack.rl_scheduler_config(local, None, scheduler_name=f"pprof-{SUITE}", leader_elect=False)
    ctx = ssl.create_default_context(cafile=str(local.pki / "ca.crt"))
    for profiling in (False, True):
        sched = rlstack.KubeScheduler(local, name=f"pprof-kube-scheduler-{SUITE}-{profiling}")
        sched.start_with(conf, profiling=profiling)
        try:
            if profiling:
                profile = sched.cpu_profile(1)
                assert profile[:2] == b"\x1f\x8b"  # pprof's gzipped protobuf
            else:
                status, _ = rlstack.http_get(f"https://127.0.0.1:{sched.port}/debug/pprof/", context=ctx)
                assert status in (401, 403)
        finally:
            sched.stop()
