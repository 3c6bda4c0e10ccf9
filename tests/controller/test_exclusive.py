"""One controller per address and per store (docs/operations.md), bad store paths,
and a clean Ctrl-C: each refusal is one line naming the path, address or holder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sia_grpc.controller.config import ConfigError, ControllerConfig
from sia_grpc.controller.shell.exclusive import InUse
from sia_grpc.controller.shell.server import Controller
from sia_grpc.testing.ports import started_record

pytestmark = pytest.mark.timeout(60)

CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          early_round_delay=5.0, heartbeat_interval=30.0,
                          heartbeat_timeout=240.0, inline_solver=True)
ENV = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}


async def _serving(port: int) -> bool:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                           timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("field", ["listen", "agent_listen"])
async def test_a_second_controller_on_a_taken_port_fails_naming_address_and_holder(field):
    async with Controller(CONFIG) as first:
        taken = f"127.0.0.1:{first.port}"
        second = Controller(replace(CONFIG, **{field: taken}))
        with pytest.raises(InUse) as err:
            await second.start()
        assert str(err.value).startswith(f"{field} {taken}: address in use (pid {os.getpid()}")
        assert await _serving(first.port)  # the first one never noticed


async def test_a_second_controller_on_the_same_store_fails_naming_the_holder(tmp_path):
    db = tmp_path / "c.db"
    cfg = replace(CONFIG, db_path=str(db))
    async with Controller(cfg) as first:
        second = Controller(cfg)
        with pytest.raises(InUse) as err:
            await second.start()
        message = str(err.value)
        assert message.startswith(f"store {db}: in use by another sia-controller (pid "
                                  f"{os.getpid()} on {socket.gethostname()}, listen "
                                  f"127.0.0.1:{first.port}, since ")
        assert message.endswith("give this one another --db")
        assert second.port == 0  # refused before it bound anything
    async with Controller(cfg):  # the lock went with the first one
        pass


async def test_in_memory_stores_need_no_lock():
    async with Controller(CONFIG), Controller(CONFIG):
        pass


@pytest.mark.parametrize("case", ["directory", "missing parent", "parent is a file"])
async def test_a_bad_store_path_is_a_config_error_naming_it(tmp_path, case):
    (tmp_path / "afile").write_text("")
    path, says = {
        "directory": (tmp_path, "is a directory; --db takes a file"),
        "missing parent": (tmp_path / "nope" / "c.db", f"directory {tmp_path / 'nope'} "
                                                       "does not exist"),
        "parent is a file": (tmp_path / "afile" / "c.db", f"{tmp_path / 'afile'} is not a "
                                                          "directory"),
    }[case]
    c = Controller(replace(CONFIG, db_path=str(path)))
    with pytest.raises(ConfigError) as err:
        await c.start()
    assert str(err.value).startswith(f"store {path}: {says}")


# -- the sia-controller process ------------------------------------------------------


def _controller(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sia_grpc.controller", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=ENV, **kw)


def _wait_serving(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        grpc.channel_ready_future(ch).result(timeout=30)


def _refused(*args: str) -> tuple[int, list[str]]:
    proc = _controller(*args, "--log-level", "error")
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err.splitlines()


def test_sia_controller_refuses_a_taken_port_and_a_used_store_in_one_line(tmp_path):
    first = _controller("--listen", "127.0.0.1:0", "--db", str(tmp_path / "a.db"),
                        "--log-format", "json")
    try:
        port = started_record(first.stderr)["port"]
        _wait_serving(port)
        code, lines = _refused("--listen", f"127.0.0.1:{port}", "--db", str(tmp_path / "b.db"))
        assert code == 1
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"sia-controller: listen 127.0.0.1:{port}: address in use "
                                   f"(pid {first.pid}: {sys.executable} -m sia_grpc.controller")
        assert lines[0].endswith("; another sia-controller?)")
        code, lines = _refused("--listen", "127.0.0.1:0", "--db", str(tmp_path / "a.db"))
        assert code == 1
        assert len(lines) == 1 and lines[0].startswith(
            f"sia-controller: store {tmp_path / 'a.db'}: in use by another sia-controller "
            f"(pid {first.pid} on {socket.gethostname()}, listen 127.0.0.1:{port}, since ")
    finally:
        first.terminate()
        first.communicate(timeout=30)
    assert first.returncode == 0


def test_sia_controller_with_a_directory_for_a_store_exits_2_in_one_line(tmp_path):
    code, lines = _refused("--listen", "127.0.0.1:0", "--db", str(tmp_path))
    assert code == 2
    assert lines == [f"sia-controller: store {tmp_path}: is a directory; --db takes a file, "
                     f"e.g. {tmp_path / 'sia-controller.db'}"]


def test_ctrl_c_stops_the_controller_and_its_solver_without_a_traceback(tmp_path):
    """SIGINT to the whole process group, as a terminal sends it: the solver child
    (a real spawned process here) must not die of it with a KeyboardInterrupt."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sia_grpc.controller", "--listen", "127.0.0.1:0",
         "--db", str(tmp_path / "c.db"), "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
        start_new_session=True)  # its own process group, as a shell job has
    try:
        started_record(proc.stderr)  # started: the solver process has answered its warm-up
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert '"controller stopped"' in err
