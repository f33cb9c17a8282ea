"""hack/replay_dynamic.py's SLA measures are only as good as the samples Prometheus holds: a missing sample
counted as an idle node, so a replay whose exporter died for the last quarter of the window still passed."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from benchmark_scripts import load_hack_script

from rlsched.policy.dynamic.replay import Compression, compare, measure_timelines, tick_times
from rlsched.policy.dynamic.simulator import DynamicSettings

T0 = 1_700_000_000.0
NAMES = [f"n{i}" for i in range(40)]
SETTINGS = DynamicSettings()
COMPRESSION = Compression(6.0)
TICKS = len(tick_times(SETTINGS.arrivals.window_s, SETTINGS.scrape.interval_s))


@pytest.fixture(scope="module")
def rd() -> ModuleType:
    return load_hack_script("replay_dynamic")


def cpu(node: int) -> float:
    return 0.95 if node < 5 else 0.2  # 12.5 % hot node-ticks


def prometheus(published_ticks: int) -> HTTPServer:
    """query_range answers with every node's series for the first ``published_ticks`` ticks only."""
    step = COMPRESSION.real(SETTINGS.scrape.interval_s)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
            result = []
            for i, name in enumerate(NAMES):
                value = cpu(i) if "cpu" in query else 0.1 if "gpu" in query else 3
                values = [[T0 + k * step, str(value)] for k in range(published_ticks)]
                result.append({"metric": {"instance": name}, "values": values})
            body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[HTTPServer] = []

    def start(published_ticks: int) -> str:
        servers.append(prometheus(published_ticks))
        return f"http://127.0.0.1:{servers[-1].server_port}"

    yield start
    for s in servers:
        s.shutdown()


def sla_rows(rd: ModuleType, url: str, exporter_health: str | None = None) -> tuple[list[dict[str, Any]], Any]:
    """The SLA rows of the comparison as ``main`` makes them, against the truth (every sample there)."""
    hot, ls, prom = rd.published_sla(url, NAMES, T0, COMPRESSION, SETTINGS)
    kw = dict(
        t0=T0,
        compression=COMPRESSION,
        window_s=SETTINGS.arrivals.window_s,
        interval_s=SETTINGS.scrape.interval_s,
        gpu_capacity_milli=1,
    )
    real = measure_timelines([], hot=hot, ls_pods=ls, **kw)
    true_hot = np.array([[cpu(i) > SETTINGS.sla.cpu_threshold for i in range(len(NAMES))] for _ in range(TICKS)])
    truth = measure_timelines([], hot=true_hot, ls_pods=np.full(true_hot.shape, 3.0), **kw)
    tolerances = {m: rd.TOLERANCES[m] for m in rd.SLA_METRICS}
    rows = rd.withhold_sla(compare(real, truth, tolerances), rd.sla_data_problems(prom, exporter_health))
    return rows, prom


def test_a_quarter_of_the_samples_missing_fails_the_sla_measures(rd: ModuleType, serve: Any) -> None:
    rows, prom = sla_rows(rd, serve(int(0.75 * TICKS)))
    assert prom["missingNodeTicks"] == (TICKS - int(0.75 * TICKS)) * len(NAMES)
    assert prom["missingFraction"] > rd.MISSING_ALLOWANCE
    assert [r["ok"] for r in rows] == [False, False]
    assert all("no Prometheus sample" in r["problem"] for r in rows)


def test_every_sample_there_keeps_the_comparison(rd: ModuleType, serve: Any) -> None:
    rows, prom = sla_rows(rd, serve(TICKS))
    assert prom["missingNodeTicks"] == 0
    assert [r["ok"] for r in rows] == [True, True] and not any("problem" in r for r in rows)


def test_missing_samples_within_the_allowance_are_tolerated(rd: ModuleType, serve: Any) -> None:
    rows, prom = sla_rows(rd, serve(TICKS - 1))  # the last tick's scrape not in yet: 1/TICKS missing
    assert 0 < prom["missingFraction"] <= rd.MISSING_ALLOWANCE
    assert [r["ok"] for r in rows] == [True, True]


def test_an_exporter_dead_after_the_drive_fails_the_sla_measures(rd: ModuleType, serve: Any) -> None:
    class DeadExporter:
        url = "http://127.0.0.1:1"

        def alive(self) -> bool:
            return False

        def exit_note(self) -> str:
            return " (killed by signal 9)"

    health = rd.exporter_problem(DeadExporter())
    assert health is not None and "not running (killed by signal 9)" in health
    rows, _ = sla_rows(rd, serve(TICKS), exporter_health=health)
    assert [r["ok"] for r in rows] == [False, False] and "load exporter" in rows[0]["problem"]
