"""A controller's round holds Python's cyclic collector off from its tick to its
last acknowledgement (`RoundLog._pause_collector`), and gives it back."""

from __future__ import annotations

import asyncio
import gc

import pytest

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell import round_log
from sia_grpc.testing.localcluster import LocalCluster

pytestmark = pytest.mark.xdist_group("heavy")

CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          early_round_delay=5.0, heartbeat_interval=30.0,
                          heartbeat_timeout=240.0, inline_solver=True)


@pytest.mark.timeout(60)
async def test_the_collector_waits_through_a_round_and_runs_again_after_it():
    assert gc.isenabled()
    async with LocalCluster({"rtx": (1, 8)}, rate=600.0, config=CONFIG) as lc, \
            AsyncSiaClient(lc.target) as client:
        await lc.wait_registered(1)
        c = lc.controller
        mid, after = [], []
        done, acked = c._round_done, c._round_acked

        def round_done(rnd: pb.Round) -> None:  # solved, its directives not yet acked
            mid.append(gc.isenabled())
            done(rnd)

        def round_acked(round_no: int, interrupted: str = "") -> None:
            acked(round_no, interrupted)
            if not c._round_clock:  # no round in flight
                after.append(gc.isenabled())

        c._round_done, c._round_acked = round_done, round_acked
        h = await client.submit(pb.JobSpec(name="ncf", application="ncf",
                                             adaptivity=pb.ADAPTIVITY_ADAPTIVE))
        async with asyncio.timeout(30):
            async for job in h.watch():
                if job.status.state == pb.JOB_STATE_RUNNING and len(after) >= 2:
                    break
        assert mid and not any(mid)
        assert after and all(after)
    assert gc.isenabled()


@pytest.mark.timeout(60)
async def test_a_round_left_open_gives_the_collector_back_at_its_cap_and_at_close(
        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(round_log, "ROUND_COLLECTOR_PAUSE_S", 0.2)
    async with LocalCluster({"rtx": (1, 8)}, rate=600.0, config=CONFIG) as lc:
        await lc.wait_registered(1)
        c = lc.controller
        c._pause_collector()  # as a tick does; no acknowledgement will end it
        assert not gc.isenabled()
        await asyncio.sleep(0.5)
        assert gc.isenabled()
        c._pause_collector()
        assert not gc.isenabled()
    assert gc.isenabled()  # closed mid-round
