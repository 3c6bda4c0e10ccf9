"""Node-agent pieces without a stream: the manual clock, backoff, configuration,
and the modeled trajectory against the simulator's own progress rule."""

from __future__ import annotations

import asyncio
import random

import pytest
from nodeagent_support import SHAPE, expected_finish_s

import sia_grpc
from sia_grpc.api import pb
from sia_grpc.emulation import load_app
from sia_grpc.nodeagent import AgentConfig, ManualClock, Trajectory, full_jitter_backoff


async def test_manual_clock_wakes_each_sleeper_at_its_deadline():
    clock = ManualClock(start=10.0)
    seen: list[tuple[str, float]] = []

    async def ticker(name: str, every: float) -> None:
        while True:
            await clock.sleep(every)
            seen.append((name, clock.time()))

    tasks = [asyncio.create_task(ticker("a", 1.0)), asyncio.create_task(ticker("b", 1.5))]
    await clock.advance(3.0)
    # Equal deadlines wake in the order the sleeps began (b's at 11.5, a's at 12).
    assert seen == [("a", 11.0), ("b", 11.5), ("a", 12.0), ("b", 13.0), ("a", 13.0)]
    assert clock.time() == 13.0 and clock.sleepers == 2
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await clock.advance(5.0)  # cancelled sleepers are skipped
    assert len(seen) == 5 and clock.sleepers == 0
    with pytest.raises(ValueError, match="back in time"):
        await clock.advance(-1.0)


class _Top(random.Random):
    """Always the upper bound, to see the envelope."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_full_jitter_backoff_doubles_up_to_the_cap_and_is_jittered():
    bounds = [full_jitter_backoff(k, base=0.2, cap=10.0, rng=_Top()) for k in range(8)]
    assert bounds == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0])
    assert full_jitter_backoff(10_000, base=0.2, cap=10.0, rng=_Top()) == 10.0  # no overflow
    rng = random.Random(1)
    draws = [full_jitter_backoff(3, base=0.2, cap=10.0, rng=rng) for _ in range(200)]
    assert all(0.0 <= d <= 1.6 for d in draws) and len(set(draws)) == 200


@pytest.mark.parametrize(("changes", "error"), [
    (dict(controller="localhost"), "controller: expected HOST:PORT"),
    (dict(controller=":50051"), "controller: expected HOST:PORT"),
    (dict(node_id=""), "node_id"),
    (dict(num_gpus=0), "num_gpus"),
    (dict(time_scale=0.0), "time_scale"),
    (dict(telemetry_interval_s=float("nan")), "telemetry_interval_s"),
    (dict(backoff_base_s=2.0, backoff_cap_s=1.0), "backoff_cap_s"),
])
def test_config_rejects_bad_values_naming_the_field(changes, error):
    fields = dict(node_id="n", controller="ctl:50051", gpu_type="rtx", num_gpus=8)
    with pytest.raises(ValueError, match=error):
        AgentConfig(**(fields | changes))


def test_config_defaults():
    c = AgentConfig(node_id="n", controller="[::1]:50051", gpu_type="rtx", num_gpus=8)
    assert (c.time_scale, c.telemetry_interval_s, c.backoff_base_s, c.backoff_cap_s) == \
        (1.0, 2.0, 0.2, 10.0)
    assert c.agent_version == sia_grpc.__version__  # the installed package's version


def test_trajectory_is_continuous_monotone_and_ends_when_computed_by_hand():
    app = load_app("ncf")  # 10 epochs: the whole run in a few segments
    gpu_type, nodes, replicas, atomic, accum = SHAPE
    alloc = pb.Allocation(num_nodes=nodes, num_replicas=replicas, atomic_batch_size=atomic,
                          accum_steps=accum)
    tr = Trajectory.plan(app, gpu_type, alloc, 0.0)
    assert len(tr.rates) == len(app.epoch_bounds())
    assert tr.progress(0.0) == 0.0 and tr.progress(tr.duration) == app.max_progress
    for start, (_, end) in zip(tr.starts[1:], app.epoch_bounds(), strict=False):
        # At each epoch end the next segment starts where the last one arrived.
        assert tr.progress(start) == end
        assert tr.progress(start * (1 - 1e-12)) == pytest.approx(end, rel=1e-9)
    samples = [tr.progress(tr.duration * k / 1000) for k in range(1001)]
    assert samples == sorted(samples)
    assert app.restart_delay + tr.duration == pytest.approx(expected_finish_s(app, 0.0),
                                                            rel=1e-12)
    done = Trajectory.plan(app, gpu_type, alloc, app.max_progress)
    assert done.duration == 0.0 and done.step_time > 0
