"""hack/local-cluster.sh's functions, called one at a time without a cluster: the ports ``up`` chooses
(never one port for two components) and the kubectl calls its waits make (bounded per request)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "hack" / "local-cluster.sh"
PORT_VARS = (
    "ETCD_PORT",
    "ETCD_PEER_PORT",
    "APISERVER_PORT",
    "KCM_PORT",
    "SCHEDULER_PORT",
    "KWOK_PORT",
    "PROMETHEUS_PORT",
)


def run_functions(snippet: str, state: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``snippet`` after the script's functions, with its state folder ``state`` and no port in use: the
    tests must not depend on what listens on this machine. (The script's last line runs ``main``; it is
    left out, so this works whether or not the script guards it.)"""
    text = "\n".join(line for line in SCRIPT.read_text().splitlines() if line != 'main "$@"')
    prelude = f"""
source /dev/stdin <<'SCRIPT_EOF'
{text}
SCRIPT_EOF
STATE={state}; RUN={state}/run; LOGS={state}/logs; PY={sys.executable}
port_listening() {{ return 1; }}
"""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RLSCHED_")}
    return subprocess.run(
        ["bash", "-c", prelude + snippet],
        env=dict(clean, RLSCHED_CLUSTER_DIR=str(state), **(env or {})),
        capture_output=True,
        text=True,
        timeout=60,
    )


def ports_env(state: Path) -> dict[str, int]:
    lines = (state / "ports.env").read_text().splitlines()
    return {k: int(v) for k, v in (line.split("=", 1) for line in lines)}


def test_an_override_equal_to_another_components_default_moves_that_component(tmp_path: Path) -> None:
    """RLSCHED_KWOK_PORT=19090 (Prometheus' default) gave kwok and Prometheus the same port."""
    done = run_functions(
        "choose_ports; echo KWOK=$KWOK_PORT PROM=$PROMETHEUS_PORT", tmp_path, {"RLSCHED_KWOK_PORT": "19090"}
    )
    assert done.returncode == 0, done.stderr
    ports = ports_env(tmp_path)
    assert set(ports) == set(PORT_VARS)
    assert ports["KWOK_PORT"] == 19090 and ports["PROMETHEUS_PORT"] != 19090
    assert len(set(ports.values())) == len(ports), ports
    assert f"KWOK=19090 PROM={ports['PROMETHEUS_PORT']}" in done.stdout


def test_a_clash_kept_in_ports_env_is_repaired(tmp_path: Path) -> None:
    """The clash used to persist: the next up kept both ports from ports.env."""
    (tmp_path / "ports.env").write_text("KWOK_PORT=19090\nPROMETHEUS_PORT=19090\nAPISERVER_PORT=16443\n")
    done = run_functions("choose_ports", tmp_path)
    assert done.returncode == 0, done.stderr
    ports = ports_env(tmp_path)
    assert len(set(ports.values())) == len(ports), ports
    assert 19090 in (ports["KWOK_PORT"], ports["PROMETHEUS_PORT"]) and ports["APISERVER_PORT"] == 16443


def test_two_equal_overrides_are_refused(tmp_path: Path) -> None:
    env = {"RLSCHED_KWOK_PORT": "20000", "RLSCHED_PROMETHEUS_PORT": "20000"}
    done = run_functions("choose_ports", tmp_path, env)
    assert done.returncode != 0
    assert "20000" in done.stderr and "RLSCHED_KWOK_PORT" in done.stderr and "RLSCHED_PROMETHEUS_PORT" in done.stderr
    assert not (tmp_path / "ports.env").exists()


def fake_kubectl(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bin" / "kubectl"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path.parent


@pytest.mark.parametrize(
    "call",
    [
        "kubectl_ apply -f -",
        "kubectl_poll get serviceaccount default -n default",
        "kubectl_poll get nodes --no-headers",
    ],
)
def test_every_kubectl_call_of_the_script_is_bounded_per_request(tmp_path: Path, call: str) -> None:
    """Without --request-timeout one request to a wedged API server blocked ``up`` past RLSCHED_UP_TIMEOUT."""
    bin_dir = fake_kubectl(tmp_path, 'printf "%s\\n" "$@"')
    done = run_functions(f"BIN={bin_dir}; {call} </dev/null", tmp_path)
    assert done.returncode == 0, done.stderr
    args = done.stdout.split()
    assert "--request-timeout=10s" in args, args
    assert args[args.index("--request-timeout=10s") + 1 :] == call.split()[1:]


def test_the_waits_poll_with_a_bounded_kubectl(tmp_path: Path) -> None:
    """kubectl retries discovery (five requests of 10 s against a server that never answers): a poll of a
    wait is also cut as a whole, and every wait of ``up`` polls that way."""
    bin_dir = fake_kubectl(tmp_path, "sleep 30")
    done = run_functions(
        f"BIN={bin_dir}; KUBECTL_POLL_S=1; s=$SECONDS; rc=0; kubectl_poll get nodes || rc=$?; "
        "echo rc=$rc took=$((SECONDS - s))",
        tmp_path,
    )
    rc, took = (int(part.split("=")[1]) for part in done.stdout.split())
    assert rc == 124 and took <= 3, done.stdout
    text = SCRIPT.read_text()
    assert "kubectl_poll get serviceaccount default -n default" in text
    assert "$(kubectl_poll get nodes -l type=kwok" in text
