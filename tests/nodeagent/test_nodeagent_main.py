"""`python -m sia_grpc.nodeagent`: arguments, and a graceful SIGTERM in a real process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest
from nodeagent_support import run

from sia_grpc.api import pb
from sia_grpc.nodeagent.__main__ import main


@pytest.mark.parametrize("argv", [
    ["--controller", "ctl:1", "--gpus", "rtx"],  # no count
    ["--controller", "ctl:1", "--gpus", "rtx:0"],
    ["--gpus", "rtx:8"],  # no controller
])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage: sia-nodeagent " in capsys.readouterr().err  # the installed command's name


def test_bad_controller_address_exits_2(capsys):
    assert main(["--controller", "nohost", "--gpus", "rtx:8"]) == 2
    assert "controller: expected HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize(("var", "value"), [("SIA_LOG_FORMAT", "bogus"),
                                            ("SIA_LOG_LEVEL", "loud")])
def test_a_bad_log_setting_in_the_environment_is_one_line_exit_2(var, value, monkeypatch,
                                                                  capsys):
    monkeypatch.setenv(var, value)
    assert main(["--controller", "127.0.0.1:1", "--gpus", "rtx:8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sia nodeagent: {var}: unknown log") and err.count("\n") == 1


async def test_sigterm_checkpoints_the_running_job_and_exits_0(controller):
    ctl, port = controller
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sia_grpc.nodeagent", "--controller", f"127.0.0.1:{port}",
        "--node-id", "sub", "--gpus", "rtx:2", "--time-scale", "60", "--log-format", "json",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(60):  # the interpreter's imports, on a busy machine
            while not ctl.streams:
                await asyncio.sleep(0.05)
        s = ctl.streams[0]
        assert s.register.node_id == "sub" and list(s.register.gpus) == [
            pb.GpuInventory(gpu_type="rtx", count=2)]
        s.directive(**run(1))
        (ack,) = await s.wait("ack")
        assert ack.ok, ack.error
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert [(e.job_id, e.kind) for e in s.of("exit")] == [
            ("job-1", pb.JobExit.KIND_CHECKPOINTED)]
        assert b'"event": "signal: closing"' in err and b'"node_id": "sub"' in err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_sigterm_still_stops_an_agent_whose_stderr_reader_went_away(controller):
    """Logging into a closed pipe raises BrokenPipeError; it must not break the
    signal handler (which logs "signal: closing") and leave the agent running."""
    ctl, port = controller
    read_end, write_end = os.pipe()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sia_grpc.nodeagent", "--controller", f"127.0.0.1:{port}",
        "--node-id", "sub", "--gpus", "rtx:2", "--log-format", "json",
        stdout=asyncio.subprocess.DEVNULL, stderr=write_end)
    os.close(write_end)
    try:
        async with asyncio.timeout(60):  # the interpreter's imports, on a busy machine
            while not ctl.streams:
                await asyncio.sleep(0.05)
        os.close(read_end)  # e.g. `sia-nodeagent ... | head` after head exits
        read_end = -1
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await proc.wait()
        assert proc.returncode == 0
    finally:
        if read_end >= 0:
            os.close(read_end)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
