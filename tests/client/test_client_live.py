"""The SDK and the `sia` commands against a live controller with modeled agents
(LocalCluster, over loopback, faster than real time): the README's SDK example as
written, forgetting a lost node, and the round history across a restart."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from sia_grpc.api import pb
from sia_grpc.cli import main
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.testing.localcluster import LocalCluster

RATE = 120.0
CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          early_round_delay=5.0, heartbeat_interval=30.0,
                          heartbeat_timeout=240.0, inline_solver=True)
README = Path(__file__).resolve().parents[2] / "README.md"


def readme_sdk_example() -> str:
    """The README's Python block that talks to a controller."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (example,) = [b for b in blocks if "SiaClient(" in b]
    return example


async def run_sia(*argv: str) -> tuple[int, list[str], str]:
    """`sia ARGV` in a thread (the controller runs on this test's loop): its exit
    code, stdout lines (among them the controller's log lines) and stderr."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(argv))
    rc = await asyncio.to_thread(run)
    return rc, out.getvalue().splitlines(), err.getvalue()


@pytest.mark.timeout(120)
async def test_the_readme_sdk_example_runs_as_written():
    example = readme_sdk_example()
    assert example.count('"127.0.0.1:50051"') == 1  # the only change: where it connects
    async with LocalCluster({"rtx": (1, 4)}, rate=RATE, config=CONFIG,
                            telemetry_interval=0.05) as lc:
        await lc.wait_registered(1)
        code = example.replace('"127.0.0.1:50051"', repr(lc.target))
        out = io.StringIO()
        # Its own print: the controller's log lines go to stdout too.
        scope = {"print": functools.partial(print, file=out)}
        await asyncio.wait_for(
            asyncio.to_thread(exec, compile(code, str(README), "exec"), scope), 60)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "CANCELLED"  # a name, not 7
    assert re.fullmatch(r"RUNNING [1-4]", lines[-2]), lines
    assert all(re.fullmatch(r"[A-Z]+ \d", ln) for ln in lines[:-1]), lines


async def _until(predicate, what: str, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


@pytest.mark.timeout(120)
async def test_only_a_lost_node_can_be_forgotten_and_its_drain_goes_with_it(tmp_path):
    cfg = replace(CONFIG, db_path=str(tmp_path / "sia.db"))
    async with LocalCluster({"rtx": (1, 4)}, rate=RATE, config=cfg) as lc, \
            AsyncSiaClient(lc.target) as client:
        gone = await lc.add_agent("aws-9", "aws", 4)
        await lc.wait_registered(2)
        rc, _, err = await run_sia("forget", "aws-9", "--controller", lc.target)
        assert (rc, err) == (1, "error: FAILED_PRECONDITION: node 'aws-9' is READY; only a "
                                "LOST node can be forgotten (stop its agent, and it is LOST "
                                "after heartbeat_timeout)\n")
        rc, _, err = await run_sia("forget", "ghost", "--controller", lc.target)
        assert (rc, err) == (1, "error: NOT_FOUND: node 'ghost' not found\n")
        await client.drain("aws-9", "bad PSU")
        await gone.close()

        async def lost() -> bool:
            nodes = {n.name: n.state for n in (await client.cluster()).nodes}
            return nodes["aws-9"] == pb.NODE_STATE_LOST
        await _until(lost, "aws-9 LOST")
        rc, out, _ = await run_sia("forget", "aws-9", "--controller", lc.target)
        assert rc == 0 and any(ln.startswith("aws-9 forgotten (aws, 4 GPUs, last heartbeat 20")
                               for ln in out)
        cluster = await client.cluster()
        assert [n.name for n in cluster.nodes] == ["rtx-0"]
        assert [t.gpu_type for t in cluster.types] == ["rtx"]
        assert "aws-9" not in await asyncio.to_thread(lc.controller._store.drains)
        await lc.restart_controller()  # no drained ghost comes back from the store
        await lc.wait_registered(1)
        assert [n.name for n in (await client.cluster()).nodes] == ["rtx-0"]


@pytest.mark.timeout(120)
async def test_the_round_history_with_its_times_is_kept_across_a_restart(tmp_path):
    cfg = replace(CONFIG, db_path=str(tmp_path / "sia.db"))
    async with LocalCluster({"rtx": (1, 4)}, rate=RATE, config=cfg,
                            telemetry_interval=0.05) as lc, \
            AsyncSiaClient(lc.target) as client:
        await lc.wait_registered(1)
        await client.submit({"name": "long", "application": "cifar10", "adaptivity": "adaptive",
                             "epochs": 500})

        async def rounds(count: int, after: int = 0):
            async def enough() -> bool:
                return len([r for r in await client.rounds(limit=100)
                            if r.round > after]) >= count
            return enough
        await _until(await rounds(3), "three rounds")

        async def saved() -> bool:  # by the timer, not only when the controller stops
            return bool(await asyncio.to_thread(lc.controller._store.rounds))
        await _until(saved, "rounds in the store")
        before = await client.rounds(limit=100)
        assert all(r.end_time.ToNanoseconds() >= r.start_time.ToNanoseconds() > 0
                   for r in before)
        await lc.restart_controller()
        kept = await client.rounds(limit=100)
        assert kept[:len(before)] == before  # as published, from the store
        await lc.wait_registered(1)
        await _until(await rounds(1, after=before[-1].round), "a round after the restart")
        numbers = [r.round for r in await client.rounds(limit=100)]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)  # go on

        rc, out, _ = await run_sia("cluster", "--controller", lc.target)
        assert rc == 0
        start = before[0].start_time.ToDatetime().replace(microsecond=0).isoformat() + "Z"
        assert [str(before[0].round), start] in [ln.split()[:2] for ln in out]
        rc, out, _ = await run_sia("cluster", "-o", "json", "--rounds", "1000",
                                   "--controller", lc.target)
        data = json.loads("\n".join(out[out.index("{"):out.index("}") + 1]))
        assert data["rounds"][0]["round"] == str(before[0].round)
        assert data["rounds"][0]["start_time"].startswith(start[:-1])
        assert "end_time" in data["rounds"][0]
