"""The controller's Prometheus endpoint (`metrics_listen`), scraped over real HTTP and
read with prometheus_client's own parser: a live cluster's families and labels, the
other paths, one registry per controller, a clean stop, and the `sia-controller` flag."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import grpc
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ConfigError, ControllerConfig
from sia_grpc.controller.shell.server import Controller
from sia_grpc.controller.stores import StoreError
from sia_grpc.observability import setup_telemetry
from sia_grpc.testing.localcluster import LocalCluster
from sia_grpc.testing.ports import started_record

CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          early_round_delay=5.0, heartbeat_interval=30.0,
                          heartbeat_timeout=240.0, inline_solver=True,
                          metrics_listen="127.0.0.1:0")
JOB_STATES = {"QUEUED", "PROFILING", "RUNNING", "RESTARTING", "SUCCEEDED", "FAILED",
              "CANCELLED"}


def get(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    """(status, content type, body) of a GET on the loopback endpoint."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def scrape(port: int) -> dict[str, prometheus_client.Metric]:
    """The families on /metrics, by name, as the official parser reads them."""
    status, content_type, body = get(port)
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4"), content_type
    return {f.name: f for f in text_string_to_metric_families(body)}


def values(family: prometheus_client.Metric, label: str | None = None,
           suffix: str = "") -> dict[str | None, float]:
    """{label value: sample value} of the family's samples named name + suffix."""
    return {(s.labels[label] if label else None): s.value for s in family.samples
            if s.name == family.name + suffix}


def rigid(n: int = 4) -> pb.JobSpec:
    return pb.JobSpec(name="cifar10", application="cifar10", adaptivity=pb.ADAPTIVITY_RIGID,
                      num_gpus=n, batch_size=512)


@pytest.mark.timeout(120)
async def test_a_live_cluster_scraped_over_http() -> None:
    # FIFO: the first job keeps its 4 GPUs, the second waits (no swaps while we look).
    config = replace(CONFIG, policy="fifo")
    async with LocalCluster({"rtx": (1, 4), "aws": (1, 2)}, rate=30.0, config=config,
                            telemetry_interval=0.05) as lc, \
            AsyncSiaClient(lc.target) as client:
        await lc.wait_registered(2)
        port = lc.controller.metrics_port
        assert port > 0
        for _ in range(2):
            await client.submit(rigid())
        async with asyncio.timeout(60):  # until a round placed one and the other waits
            while True:
                families = await asyncio.to_thread(scrape, port)
                jobs = values(families["sia_jobs"], "state")
                rounds = families.get("sia_rounds")
                if jobs["RUNNING"] == 1 and jobs["QUEUED"] == 1 and rounds is not None:
                    break
                await asyncio.sleep(0.05)

    assert families["sia_jobs"].type == "gauge"
    assert set(jobs) == JOB_STATES  # every CLI state name, 0 included
    assert sum(jobs.values()) == 2
    assert values(families["sia_queue_length"]) == {None: 1}
    assert values(families["sia_queue_max_wait_seconds"])[None] > 0  # the waiting job
    assert values(families["sia_agents_connected"]) == {None: 2}
    assert values(families["sia_nodes"], "state") == {"READY": 2, "LOST": 0, "DRAINING": 0}
    assert values(families["sia_nodes_isolation"], "isolation") == {
        "none": 0, "user": 0, "sandbox": 0, "modeled": 2}
    assert values(families["sia_gpus_capacity"], "gpu_type") == {"rtx": 4, "aws": 2}
    assert values(families["sia_gpus_allocated"], "gpu_type") == {"rtx": 4, "aws": 0}
    assert values(families["sia_solve_timeout_seconds"]) == {None: CONFIG.solve_timeout}
    assert families["sia_events_pending"].type == "gauge"

    assert rounds.type == "counter"
    done = values(rounds, "outcome", "_total")
    assert done["ok"] >= 1
    for name in ("sia_round_duration_seconds", "sia_solve_duration_seconds"):
        hist = families[name]
        assert hist.type == "histogram" and hist.unit == ""
        buckets: dict[str, float] = {}  # summed over the triggers
        for sample in hist.samples:
            if sample.name == name + "_bucket":
                le = sample.labels["le"]
                buckets[le] = buckets.get(le, 0.0) + sample.value
        assert {"1.0", "45.0", "+Inf"} <= set(buckets)
        count = sum(s.value for s in hist.samples if s.name == name + "_count")
        assert count == buckets["+Inf"] >= 1
    triggers = values(families["sia_round_duration_seconds"], "trigger", "_count")
    assert triggers and set(triggers) <= {"timer", "arrival", "requeue"}
    [target] = families["target_info"].samples  # OpenTelemetry's resource
    assert target.labels["service_name"] == "sia-controller"

    # Every name the operations guide lists, or uses in its alerts, is served.
    served = set(families) | {s.name for f in families.values() for s in f.samples}
    assert documented_names() <= served, documented_names() - served


def documented_names() -> set[str]:
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    section = text[text.index("## Metrics (Prometheus)"):]
    section = section[:section.index("\n## ", 1)]
    names = set(re.findall(r"\bsia_[a-z_]+", section))
    assert {"sia_jobs", "sia_rounds_total", "sia_solve_duration_seconds_bucket"} <= names
    return names


async def test_other_paths_two_controllers_and_a_clean_stop() -> None:
    before = {t.ident for t in threading.enumerate()}
    a = Controller(replace(CONFIG, solve_timeout=11.0))
    b = Controller(replace(CONFIG, solve_timeout=22.0))
    async with a, b:
        assert a.metrics_port != b.metrics_port
        # Each controller reports its own: one registry each, never the global one.
        for c, timeout in ((a, 11.0), (b, 22.0)):
            families = await asyncio.to_thread(scrape, c.metrics_port)
            assert values(families["sia_solve_timeout_seconds"]) == {None: timeout}
            assert values(families["sia_agents_connected"]) == {None: 0}
            assert "sia_rounds" not in families  # no round yet
        assert b"sia_" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)

        status, content_type, body = await asyncio.to_thread(get, a.metrics_port, "/")
        assert status == 200 and content_type.startswith("text/html")
        assert 'href="/metrics"' in body
        status, _, body = await asyncio.to_thread(get, a.metrics_port, "/jobs")
        assert status == 404 and "/metrics" in body
        port = a.metrics_port

    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass
    left = [t.name for t in threading.enumerate()
            if t.ident not in before and t.name.startswith("sia-metrics")]
    assert not left


async def test_metrics_listen_errors_name_the_setting(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = Controller(replace(CONFIG, metrics_listen=f"127.0.0.1:{taken.getsockname()[1]}"))
        with pytest.raises(OSError, match=r"metrics_listen 127.0.0.1:\d+: address in use"):
            await busy.start()
    # A start that fails later (here the store: not a database) does not leave
    # /metrics serving.
    garbage = tmp_path / "sia.db"
    garbage.write_bytes(b"not a database" * 100)
    late = Controller(replace(CONFIG, db_path=str(garbage)))
    with pytest.raises((StoreError, ConfigError), match="sia.db"):
        await late.start()
    assert late.metrics_port > 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", late.metrics_port)).close()
    # A telemetry made without the Prometheus reader cannot feed the endpoint.
    plain = setup_telemetry(env={})
    try:
        with pytest.raises(ConfigError, match="metrics_listen"):
            await Controller(CONFIG, telemetry=plain).start()
    finally:
        plain.shutdown()
    with pytest.raises(ValueError, match="OTEL_SDK_DISABLED"):
        setup_telemetry(env={"OTEL_SDK_DISABLED": "true"}, prometheus=True)


async def test_a_solve_that_times_out_counts_its_wait_not_zero() -> None:
    # Every solve times out (1 ms): the round fails, and its solve phase is the wait.
    config = replace(CONFIG, solve_timeout=0.001)
    async with LocalCluster({"rtx": (1, 4)}, rate=600.0, config=config,
                            telemetry_interval=0.05) as lc, \
            AsyncSiaClient(lc.target) as client:
        await lc.wait_registered(1)
        await client.submit(rigid())
        async with asyncio.timeout(60):  # (a round skipped for want of a profile has a
            while not any("timed out" in r.note for r in lc.controller.rounds):  # note too)
                await asyncio.sleep(0.02)
        families = await asyncio.to_thread(scrape, lc.controller.metrics_port)
    assert values(families["sia_rounds"], "outcome", "_total")["error"] >= 1
    solve = families["sia_solve_duration_seconds"]
    assert values(solve, suffix="_count")[None] >= 1
    # At least the timed-out solve's wait (a round with less to solve may finish
    # under the 1 ms, so not every solve counted need have waited it).
    assert values(solve, suffix="_sum")[None] >= config.solve_timeout


@pytest.mark.timeout(60)
def test_sia_controller_metrics_listen_flag(tmp_path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sia_grpc.controller", "--listen", "127.0.0.1:0",
         "--db", str(tmp_path / "c.db"), "--log-format", "json",
         "--metrics-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"})
    try:
        log: list[str] = []
        started = started_record(proc.stdout, log)
        port, metrics = started["port"], started["metrics_port"]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            grpc.channel_ready_future(ch).result(timeout=30)  # /metrics is bound before
        families = scrape(metrics)
        assert set(values(families["sia_jobs"], "state")) == JOB_STATES
        assert values(families["sia_solve_timeout_seconds"]) == {None: 45.0}
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        out = "".join(log) + out
        assert proc.returncode == 0, out
        assert f'"metrics_port": {metrics}' in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
