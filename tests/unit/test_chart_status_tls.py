"""HTTPS on the extender's status port in the chart (``extender.statusTls``) and in manifests/.

- Defaults: the chart makes a Secret (tls.crt, tls.key, ca.crt) whose certificate verifies with its
  CA for every name a caller uses — the Service's four DNS names, localhost and 127.0.0.1 — under
  OpenSSL's strict X.509 checks, and loads into the extender; the extender mounts it and its settings
  point there; the probes use HTTPS; the ServiceMonitor verifies with the CA for the Service's name.
  (The operator's https URL and CA mount: test_chart_sync.py.) ``helm template`` cannot look up, so
  the reuse of an existing Secret on upgrade is left to tests/e2e/test_helm.py.
- ``secretName``: no Secret of the chart's, the user's one mounted everywhere instead.
- ``enabled: false``: plain HTTP everywhere, no Secret, no mounts.
- ``extender.config.server.statusTls`` is refused, naming the value to use.
- NOTES.txt's curl trusts the Secret's CA and asks for the Service's name, resolved to the
  port-forward (``--resolve``): a certificate of one's own (cert-manager's) need not name localhost;
  the Service's status port says ``appProtocol: https``.
- Values of a release from before ``statusTls`` existed (``helm upgrade --reuse-values``) render as
  the defaults do.
- manifests/ name the Secret hack/sync-chart.py sets and carry no key; docs/install.md's openssl and
  kubectl commands make that Secret (run here, kubectl offline) with a certificate that verifies.
"""

from __future__ import annotations

import asyncio
import base64
import shlex
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_chart_images_and_notes import KUBECTL, rendered_notes, status_section
from test_chart_install_docs import INSTALL, shell_blocks
from test_chart_sync import ALL_ON, REPO, containers, find, needs_helm, pod_spec, render, sync, watching

from rlsched.extender.settings import StatusTlsSettings
from rlsched.extender.settings import load_settings as load_extender
from rlsched.extender.status_tls import load_context, not_after

SERVICE_NAMES = (
    "rl-scheduler",
    "rl-scheduler.rlsched-system",
    "rl-scheduler.rlsched-system.svc",
    "rl-scheduler.rlsched-system.svc.cluster.local",
    "localhost",
    "127.0.0.1",
)
"""Every name the status port is reached by (release rl-scheduler in rlsched-system)."""


def handshake(server: ssl.SSLContext, ca: Path, name: str) -> None:
    """A TLS handshake in memory, the client trusting ``ca`` for ``name`` under the strict X.509
    checks newer Pythons turn on by default; raises ssl.SSLError when it does not verify."""
    client = ssl.create_default_context(cafile=str(ca))
    client.verify_flags |= getattr(ssl, "VERIFY_X509_STRICT", 0)
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname=name)
    for _ in range(10):
        done = 0
        for end in (cli, srv):
            try:
                end.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done == 2:
            return
    raise AssertionError("the handshake did not finish")


def served_by(folder: Path, ca: Path) -> None:
    """The pair in ``folder`` loads as the extender loads it, and verifies with ``ca`` for every name;
    a CA of another install does not verify it."""
    server = load_context(StatusTlsSettings(str(folder / "tls.crt"), str(folder / "tls.key")))
    for name in SERVICE_NAMES:
        handshake(server, ca, name)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, ca, "rl-scheduler.other-namespace.svc")


def write_secret(secret: dict, folder: Path) -> Path:
    folder.mkdir()
    for key, value in secret["data"].items():
        (folder / key).write_bytes(base64.b64decode(value))
    return folder


def extender_settings(objs: list[dict], tmp_path: Path):
    path = tmp_path / "extender.yaml"
    path.write_text(find(objs, "ConfigMap", "-config")["data"]["extender.yaml"])
    return load_extender(path)


def mounted(objs: list[dict]) -> tuple[dict, str | None]:
    """(the extender container, the Secret its status-tls volume names, or None)."""
    spec = pod_spec(objs, "scheduler")
    volumes = {v["name"]: v for v in spec["volumes"]}
    secret = volumes.get("status-tls", {}).get("secret", {}).get("secretName")
    return containers(spec)["extender"], secret


@needs_helm
@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_the_chart_makes_a_certificate_the_extender_serves_and_callers_verify(tmp_path, values) -> None:
    objs = render(tmp_path, watching(values, "rlsched-system"))
    secret = find(objs, "Secret", "-status-tls")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    files = write_secret(secret, tmp_path / "secret")
    served_by(files, files / "ca.crt")
    assert b"PRIVATE KEY" not in (files / "ca.crt").read_bytes()  # the CA's key is not kept
    expires = not_after(str(files / "tls.crt"))
    assert expires is None or expires - time.time() > 3649 * 86400  # 3650 days (values.yaml)
    # the extender mounts it and its settings point into the mount
    ext, name = mounted(objs)
    assert name == secret["metadata"]["name"]
    (mount,) = [m for m in ext["volumeMounts"] if m["name"] == "status-tls"]
    assert mount["readOnly"] and "subPath" not in mount  # the kubelet's updates must reach the extender
    tls = extender_settings(objs, tmp_path).server.status_tls
    assert (tls.cert_file, tls.key_file) == (f"{mount['mountPath']}/tls.crt", f"{mount['mountPath']}/tls.key")
    # the kubelet's probes speak HTTPS (they do not verify)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert ext[probe]["httpGet"]["scheme"] == "HTTPS", probe
    if values is ALL_ON:  # the ServiceMonitor verifies with the CA, for the Service's name
        endpoint = find(objs, "ServiceMonitor")["spec"]["endpoints"][0]
        assert endpoint["scheme"] == "https"
        assert endpoint["tlsConfig"] == {
            "ca": {"secret": {"name": secret["metadata"]["name"], "key": "ca.crt"}},
            "serverName": f"{find(objs, 'Service')['metadata']['name']}.rlsched-system.svc",
        }


@needs_helm
def test_a_secret_of_ones_own_is_mounted_instead(tmp_path) -> None:
    values = {
        "extender": {"statusTls": {"secretName": "from-cert-manager"}},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "networkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]},
    }
    objs = render(tmp_path, values)
    assert not [o for o in objs if o["kind"] == "Secret"]
    _, name = mounted(objs)
    op_volumes = {v["name"]: v for v in pod_spec(objs, "operator")["volumes"]}
    assert name == op_volumes["extender-ca"]["secret"]["secretName"] == "from-cert-manager"
    tls_config = find(objs, "ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"]
    assert tls_config["ca"]["secret"]["name"] == "from-cert-manager"


@needs_helm
def test_disabled_is_plain_http_everywhere(tmp_path) -> None:
    from rlsched.operator.settings import load_settings as load_operator

    values = {
        "extender": {"statusTls": {"enabled": False}},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "networkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]},
    }
    objs = render(tmp_path, values)
    assert not [o for o in objs if o["kind"] == "Secret"]
    ext, name = mounted(objs)
    assert name is None and "status-tls" not in str(ext["volumeMounts"])
    assert all("scheme" not in ext[p]["httpGet"] for p in ("startupProbe", "livenessProbe", "readinessProbe"))
    assert extender_settings(objs, tmp_path).server.status_tls == StatusTlsSettings()
    op_path = tmp_path / "operator.yaml"
    op_path.write_text(find(objs, "ConfigMap", "-operator")["data"]["operator.yaml"])
    op = load_operator(op_path, {}).extender
    assert op.status_url.startswith("http://") and op.ca_file is None
    assert "extender-ca" not in str(pod_spec(objs, "operator")["volumes"])
    endpoint = find(objs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint


@needs_helm
def test_a_probe_that_names_its_scheme_keeps_it(tmp_path) -> None:
    probe = {"httpGet": {"path": "/healthz", "port": "http-status", "scheme": "HTTP"}, "periodSeconds": 10}
    ext, _ = mounted(render(tmp_path, {"extender": {"livenessProbe": probe}}))
    assert ext["livenessProbe"]["httpGet"]["scheme"] == "HTTP" and ext["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


@needs_helm
def test_status_tls_in_extender_config_is_refused(tmp_path) -> None:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump({"extender": {"config": {"server": {"statusTls": {"certFile": "/x"}}}}}))
    done = subprocess.run(
        [sync.helm_binary(), "template", "x", str(sync.CHART), "--values", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "extender.config.server.statusTls: set extender.statusTls instead" in done.stderr


NOTES_CURL_URL = "https://rl-scheduler.rlsched-system.svc:8889/status"


def notes_curl(notes: str) -> list[str]:
    """NOTES.txt's curl of /status, as argv."""
    lines = [ln.strip() for ln in status_section(notes).splitlines()]
    (curl,) = [shlex.split(ln) for ln in lines if ln.startswith("curl ")]
    return curl


@needs_helm
@pytest.mark.parametrize("secret", ["", "from-cert-manager"], ids=["generated", "own-secret"])
def test_notes_curl_trusts_the_secrets_ca_and_asks_for_the_services_name(tmp_path, secret) -> None:
    notes = rendered_notes(tmp_path, f"extender: {{statusTls: {{secretName: '{secret}'}}}}\n")
    lines = [ln.strip() for ln in status_section(notes).splitlines()]
    (save,) = [ln for ln in lines if " get secret " in ln]
    assert save == (
        f"kubectl -n rlsched-system get secret {secret or 'rl-scheduler-status-tls'} "
        "-o jsonpath='{.data.ca\\.crt}' | base64 -d > status-ca.crt"
    )
    curl = notes_curl(notes)
    assert curl[:4] == ["curl", "-s", "--cacert", "status-ca.crt"] and curl[-1] == NOTES_CURL_URL
    # the name the certificate carries (every Secret's: values.yaml asks for it), sent to the port-forward
    assert curl[curl.index("--resolve") + 1] == "rl-scheduler.rlsched-system.svc:8889:127.0.0.1"


@needs_helm
def test_notes_curl_without_tls_is_plain_http_to_the_port_forward(tmp_path) -> None:
    off = status_section(rendered_notes(tmp_path, "extender: {statusTls: {enabled: false}}\n"))
    assert "get secret" not in off and "http://localhost:8889/status" in off and "--cacert" not in off
    assert "--resolve" not in off


@needs_helm
@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("openssl") is None, reason="curl or openssl missing")
async def test_notes_curl_verifies_a_certificate_that_names_only_the_service(tmp_path) -> None:
    """A Secret of one's own whose certificate names ``<svc>.<ns>.svc`` and not localhost (what a
    cert-manager Certificate for the Service holds), served on 127.0.0.1 as a port-forward would:
    NOTES' curl, run as printed (its token part left out: auth none here), gets /status."""
    from test_extender_status_tls import reviewed, settings

    from rlsched.extender.settings import StatusTlsSettings

    pki = service_only_pki(tmp_path / "pki", "rl-scheduler.rlsched-system.svc")
    curl = [a for a in notes_curl(rendered_notes(tmp_path)) if not a.startswith(("-H", "Authorization"))]
    async with reviewed(settings(StatusTlsSettings(str(pki / "tls.crt"), str(pki / "tls.key")), "none")) as run:
        port = str(run.status[1])
        argv = [a.replace(":8889", f":{port}") for a in curl]
        shutil.copy(pki / "ca.crt", tmp_path / "status-ca.crt")
        done = await asyncio.create_subprocess_exec(*argv, cwd=tmp_path, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(done.communicate(), 30)
        assert done.returncode == 0 and b'"statusTls"' in out, (argv, out[:300])
        localhost = [a.replace(NOTES_CURL_URL, f"https://localhost:{port}/status") for a in curl if a != "--resolve"]
        localhost = [a for a in localhost if not a.endswith(":127.0.0.1")]
        done = await asyncio.create_subprocess_exec(*localhost, cwd=tmp_path, stdout=asyncio.subprocess.PIPE)
        await asyncio.wait_for(done.communicate(), 30)
        assert done.returncode == 60, localhost  # curl: the certificate does not name localhost


def service_only_pki(folder: Path, name: str) -> Path:
    """A CA and a certificate it signs for ``name`` alone (openssl), in ``folder``."""
    folder.mkdir(parents=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (folder / "tls.ext").write_text(
        f"subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    for argv in (
        ["req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=own-ca"]
        + ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", *key, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={name}"],
        ["x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2"]
        + ["-extfile", "tls.ext", "-out", "tls.crt"],
    ):
        subprocess.run(["openssl", *argv], cwd=folder, check=True, capture_output=True, timeout=60)
    return folder


@needs_helm
def test_the_status_port_of_the_service_says_https(tmp_path) -> None:
    def status_port(values: dict | None) -> dict:
        (port,) = [p for p in find(render(tmp_path, values), "Service")["spec"]["ports"] if p["name"] == "http-status"]
        return port

    assert status_port(None)["appProtocol"] == "https"  # the name stays: the alert rule selects it
    assert "appProtocol" not in status_port({"extender": {"statusTls": {"enabled": False}}})


def values_before_status_tls(tmp_path: Path) -> Path:
    """The chart with the values.yaml of a release from before extender.statusTls: what `helm upgrade
    --reuse-values` renders with (the release's values, not the chart's new defaults)."""
    chart = tmp_path / "old-values-chart"
    shutil.copytree(sync.CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    del values["extender"]["statusTls"]
    values["metrics"]["serviceMonitor"]["enabled"] = True  # every template that reads statusTls
    values["networkPolicy"]["metricsFrom"] = [{"namespaceSelector": {}}]
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    return chart


def comparable(objs: list[dict]) -> list[dict]:
    """The objects without what differs from one rendering to the next: the generated certificate
    and the config checksums."""
    out = yaml.safe_load(yaml.safe_dump(objs))
    for o in out:
        if o["kind"] == "Secret":
            o["data"] = sorted(o["data"])
        annotations = o.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
        for key in [k for k in annotations if k.startswith("checksum/")]:
            del annotations[key]
    return out


@needs_helm
def test_values_from_before_status_tls_render_as_the_defaults_do(tmp_path) -> None:
    chart = values_before_status_tls(tmp_path)
    args = ["template", "rl-scheduler", "--namespace", "rlsched-system"]
    old = subprocess.run([sync.helm_binary(), *args, str(chart)], capture_output=True, text=True, timeout=120)
    assert old.returncode == 0, old.stderr  # was: nil pointer evaluating interface {}.enabled
    same = yaml.safe_dump(
        {
            "metrics": {"serviceMonitor": {"enabled": True}},
            "networkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]},
        }
    )
    (tmp_path / "same.yaml").write_text(same)
    new = subprocess.run(
        [sync.helm_binary(), *args, str(sync.CHART), "--values", str(tmp_path / "same.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert new.returncode == 0, new.stderr
    docs = lambda text: [d for d in yaml.safe_load_all(text) if d]  # noqa: E731
    assert comparable(docs(old.stdout)) == comparable(docs(new.stdout))
    (tmp_path / "notes").mkdir()
    assert notes_curl(rendered_notes(tmp_path / "notes", chart=chart))[-1] == NOTES_CURL_URL


# -- manifests/ and the Secret they need ------------------------------------------------------------------


def test_manifests_name_the_secret_and_carry_no_key() -> None:
    texts = {p.name: p.read_text() for p in (REPO / "manifests").glob("*.yaml")}
    assert not [n for n, t in texts.items() if "PRIVATE KEY" in t or "\nkind: Secret\n" in t]
    docs = [d for t in texts.values() for d in yaml.safe_load_all(t) if d]
    scheduler = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-scheduler"))
    volumes = {v["name"]: v for v in scheduler["spec"]["template"]["spec"]["volumes"]}
    assert volumes["status-tls"]["secret"]["secretName"] == sync.STATUS_TLS_SECRET


def secret_commands() -> list[str]:
    """docs/install.md's block that makes the status port's Secret for manifests/."""
    (block,) = [b for b in shell_blocks(INSTALL) if f"create secret generic {sync.STATUS_TLS_SECRET}" in b]
    return [ln.split("   #")[0].strip() for ln in block.splitlines() if ln.strip()]


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl missing: run hack/build-tools.sh (.tools/bin/kubectl)")
def test_the_install_docs_make_the_secret_manifests_need(tmp_path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl missing")
    lines = secret_commands()
    shell = [ln for ln in lines if not ln.startswith("kubectl ")]
    done = subprocess.run(["bash", "-euc", "\n".join(shell)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (create,) = [shlex.split(ln) for ln in lines if ln.startswith("kubectl ") and " create secret " in ln]
    done = subprocess.run(  # as printed, offline
        [str(KUBECTL), *create[1:], "--dry-run=client", "-o", "yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "KUBECONFIG": "/dev/null", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    secret = yaml.safe_load(done.stdout)
    assert (secret["metadata"]["namespace"], secret["metadata"]["name"]) == ("rlsched-system", sync.STATUS_TLS_SECRET)
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    files = write_secret(secret, tmp_path / "secret")
    served_by(files, files / "ca.crt")
    applies = [ln for ln in lines if ln.startswith("kubectl apply")]
    assert applies[0].endswith("manifests/00-namespace.yaml") and lines.index(applies[0]) < lines.index(
        next(ln for ln in lines if " create secret " in ln)
    )  # the namespace first: the Secret lives in it


@needs_helm
def test_the_expiry_alert_comes_with_the_https_status_port(tmp_path) -> None:
    def alerts(values: dict) -> dict[str, dict]:
        rule = find(render(tmp_path, values), "PrometheusRule")
        return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}

    on = alerts(ALL_ON)["RLSchedulerStatusCertExpiring"]
    assert "rlsched_extender_status_tls_not_after_seconds" in on["expr"]
    assert on["expr"].rstrip().endswith("< 1209600")  # 14 days
    custom = {**ALL_ON, "metrics": {**ALL_ON["metrics"], "prometheusRule": {"enabled": True, "certExpiryDays": 30}}}
    assert alerts(custom)["RLSchedulerStatusCertExpiring"]["expr"].rstrip().endswith("< 2592000")
    # values of a release from before the setting (helm upgrade --reuse-values): the default, not 0
    older = {**ALL_ON, "metrics": {**ALL_ON["metrics"], "prometheusRule": {"enabled": True, "certExpiryDays": None}}}
    assert alerts(older)["RLSchedulerStatusCertExpiring"]["expr"].rstrip().endswith("< 1209600")
    plain = {**ALL_ON, "extender": {**ALL_ON.get("extender", {}), "statusTls": {"enabled": False}}}
    assert "RLSchedulerStatusCertExpiring" not in alerts(plain)  # no certificate, no gauge to watch
