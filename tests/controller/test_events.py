"""The cluster's event history on a live controller over real gRPC (issue 37): one
history, written with the state changes it describes, that `sia events`, `sia
describe` and every view read. A job's story from submission to its end; a node
killed with SIGKILL is logged, recorded and named with the jobs it held; a watch
resumed from an id gets exactly what it missed; a tenant sees only its own jobs."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError
from sia_grpc.api.story import kind_name
from sia_grpc.cli import main
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.server import Controller
from sia_grpc.security.tokens import add_token
from sia_grpc.testing.localcluster import LocalCluster

pytestmark = pytest.mark.xdist_group("heavy")

CONFIG = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=60.0,
                          early_round_delay=5.0, heartbeat_interval=30.0,
                          heartbeat_timeout=120.0, inline_solver=True)
RIGID = pb.JobSpec(name="c", application="cifar10", adaptivity=pb.ADAPTIVITY_RIGID,
                   num_gpus=8, batch_size=1024)
K = pb.EventKind


def spec(name: str) -> pb.JobSpec:
    return pb.JobSpec(name=name, application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE)


def kinds(events: list[pb.Event]) -> list[str]:
    return [kind_name(e.kind) for e in events]


async def until(predicate, timeout: float = 30.0):
    async with asyncio.timeout(timeout):
        while not (got := await predicate()):
            await asyncio.sleep(0.05)
    return got


@pytest.mark.timeout(120)
async def test_a_jobs_story_and_a_lost_node_are_in_the_one_history(capsys):
    with capture_logs() as logs:
        async with LocalCluster({"aws": (1, 4)}, rate=300.0, config=CONFIG,
                                telemetry_interval=0.05) as lc, \
                AsyncSiaClient(lc.target) as sia:
            proc = lc.spawn_agent("rtx-1", "rtx", 8)
            await lc.wait_registered(2)
            h = await sia.submit(RIGID)  # only the rtx node (the process) can hold it
            await until(lambda: _running_on(sia, h.job_id, "rtx-1"))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            lost = await until(lambda: sia.events(kinds=[K.EVENT_KIND_NODE_LOST]))
            await lc.add_agent("rtx-2", "rtx", 8)
            final = await asyncio.wait_for(h.wait(), 60)
            story = await sia.events(job_id=h.job_id, limit=1000)
            everything = await sia.events(limit=1000)
            rounds = await sia.rounds(limit=1000)
            await asyncio.to_thread(main, ["describe", h.job_id, "--controller", lc.target])
    assert final.status.state == pb.JOB_STATE_SUCCEEDED
    # The lost node: an event naming it, when, and the job it held; a warning in the log.
    (node_lost,) = lost
    assert node_lost.node == "rtx-1" and node_lost.term == 1 and node_lost.time.seconds
    assert h.job_id in node_lost.message and "requeued" in node_lost.message
    assert any(e["event"] == "node lost" and e["node_id"] == "rtx-1"
               and e["log_level"] == "warning" for e in logs)
    # The job's story, in order: submitted, waiting with its reasons, running, requeued
    # when its node was lost, running again, done.
    said = [(kind_name(e.kind), pb.JobState.Name(e.state), e.reason) for e in story]
    assert said[0][0] == "JobSubmitted", said
    assert said[-1][:2] == ("JobChanged", "JOB_STATE_SUCCEEDED"), said
    states = [s for _, s, _ in said]
    running = [i for i, s in enumerate(states) if s == "JOB_STATE_RUNNING"]
    assert len(running) >= 2, said  # before and after the loss
    assert any("rtx-1" in r and "lost" in r for _, _, r in said), said
    # One history: ids increase, every event of the job is in the whole history too,
    # rounds are started and finished under their term, the controller took office first.
    ids = [e.id for e in everything]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert {e.id for e in story} <= set(ids)
    assert kinds(everything)[0] == "Leader"
    assert {"NodeRegistered", "RoundStarted", "RoundFinished", "NodeLost"} <= set(
        kinds(everything))
    assert all(e.term == 1 for e in everything)
    assert rounds and all(r.term == 1 for r in rounds)  # (term, round) names a round
    # `sia describe`: the job, then its story (its events only).
    out = capsys.readouterr().out
    assert out.startswith("Job:") and h.job_id in out
    assert "JobSubmitted" in out and "SUCCEEDED" in out and "NodeLost" not in out


async def _running_on(sia: AsyncSiaClient, job_id: str, node: str) -> bool:
    job = (await sia.get(job_id)).proto
    return (job.status.state == pb.JOB_STATE_RUNNING and job.status.progress > 0
            and {g.node for g in job.status.allocation.gpus} == {node})


@pytest.mark.timeout(60)
async def test_a_watch_resumed_from_an_id_gets_exactly_what_it_missed(tmp_path):
    async with Controller(replace(CONFIG, db_path=str(tmp_path / "sia.db"))) as c, \
            AsyncSiaClient(f"127.0.0.1:{c.port}") as sia:
        for k in range(3):
            await sia.submit(spec(f"a{k}"))
        first = await sia.events(kinds=[K.EVENT_KIND_JOB_SUBMITTED])
        assert [e.job_id.split("-")[0] for e in first] == ["a0", "a1", "a2"]
        seen = first[0].id
        for k in range(3, 5):
            await sia.submit(spec(f"a{k}"))
        missed = [e for e in await sia.events(after_id=seen, limit=1000)]
        got: list[pb.Event] = []
        async with asyncio.timeout(10):
            async for event in sia.watch_events(after_id=seen):
                got.append(event)
                if len(got) == len(missed):
                    break
        assert [e.id for e in got] == [e.id for e in missed]
        # And after those: new events only, none twice.
        stream = sia.watch_events(after_id=got[-1].id, kinds=[K.EVENT_KIND_JOB_SUBMITTED])
        await sia.submit(spec("late"))
        async with asyncio.timeout(10):
            late = await anext(aiter(stream))
        assert late.job_id.startswith("late") and late.id > got[-1].id


@pytest.mark.timeout(60)
async def test_a_watch_from_now_broken_before_its_first_event_misses_nothing(tmp_path):
    # "From now" is pinned to the newest id when the watch is asked for: a stream the
    # controller's restart breaks before any event reopens after that id, and gets the
    # new controller's first event (written before it serves), not "from the reopen".
    config = replace(CONFIG, db_path=str(tmp_path / "sia.db"))
    async with LocalCluster({}, config=config) as lc, AsyncSiaClient(lc.target) as sia:
        (newest,) = await sia.events(limit=1)
        first = asyncio.ensure_future(anext(aiter(sia.watch_events())))
        await until(lambda: _watching(lc))
        await lc.restart_controller()
        async with asyncio.timeout(20):
            event = await first
        assert event.kind == K.EVENT_KIND_LEADER and event.id > newest.id


async def _watching(lc: LocalCluster) -> bool:
    assert lc.controller is not None
    return bool(lc.controller._event_watchers)


@pytest.mark.timeout(60)
async def test_a_tenant_sees_its_own_jobs_events_and_a_bad_filter_is_invalid(tmp_path):
    tokens = tmp_path / "tokens.toml"
    a, b = add_token(tokens, "team-a"), add_token(tokens, "team-b")
    admin = add_token(tokens, "ops", admin=True)
    async with Controller(replace(CONFIG, tokens_file=str(tokens))) as c:
        target = f"127.0.0.1:{c.port}"
        async with AsyncSiaClient(target, token=a) as sa, \
                AsyncSiaClient(target, token=b) as sb, \
                AsyncSiaClient(target, token=admin) as ops:
            await sa.submit(spec("mine"), job_id="mine")
            await sb.submit(spec("theirs"), job_id="theirs")
            mine, theirs = (await sa.get("mine")).job_id, (await sb.get("theirs")).job_id
            assert {e.job_id for e in await sa.events() if e.job_id} == {mine}
            assert await sa.events(job_id=theirs) == []
            assert {e.job_id for e in await sa.events(job_id="mine")} == {mine}
            assert {e.job_id for e in await ops.events() if e.job_id} == {mine, theirs}
            with pytest.raises(ApiError) as err:
                await ops.events(kinds=[999])
            assert err.value.code.name == "INVALID_ARGUMENT" and err.value.field == "filter.kinds"
            with pytest.raises(ApiError) as err:
                await ops.events(limit=5000)
            assert err.value.field == "limit"


@pytest.mark.timeout(60)
async def test_sighup_applies_the_config_files_queues_or_says_why_not(tmp_path):
    """Issue 37, item 5: SIGHUP with an edited [queues] table in controller.toml was
    silently ignored. Now it is applied, validated, with what changed in the log and
    the history; a bad table is refused aloud, the last good queues kept."""
    from sia_grpc.controller.config import load_config

    toml = tmp_path / "controller.toml"
    toml.write_text('listen = "127.0.0.1:0"\ndb_path = ":memory:"\ninline_solver = true\n'
                    '[[queues.queue]]\nname = "research"\n')
    config = load_config(toml)
    async with Controller(config) as c, AsyncSiaClient(f"127.0.0.1:{c.port}") as sia:
        assert [q.name for q in c.state.queues.queues] == ["research", "default"]
        toml.write_text(toml.read_text() + '[[queues.queue]]\nname = "batch"\n'
                        'guarantee = {rtx = 2}\n')
        with capture_logs() as logs:
            c.reload()
        await until(lambda: _queues_are(c, ["research", "batch", "default"]))
        toml.write_text(toml.read_text() + '[[queues.queue]]\nname = "research"\n')
        c.reload()
        reloads = await until(lambda: _reloads(sia, 2))
    assert "reloaded: added batch" in reloads[0].message, reloads[0].message
    assert "refused" in reloads[1].message and "research" in reloads[1].message
    assert [q.name for q in c.state.queues.queues] == ["research", "batch", "default"]
    assert any(e["event"] == "reload" and "added batch" in e["message"] for e in logs)


async def _queues_are(c: Controller, names: list[str]) -> bool:
    return [q.name for q in c.state.queues.queues] == names


async def _reloads(sia: AsyncSiaClient, n: int) -> list[pb.Event] | None:
    got = await sia.events(kinds=[K.EVENT_KIND_RELOAD])
    return got if len(got) >= n else None


@pytest.mark.timeout(60)
async def test_a_new_leader_with_work_acts_at_once_not_at_its_first_timer_round(tmp_path):
    """Issue 37, item 9: a drain (or a submit) just before a handover had its early
    round die with the old leader; the new leader waited for its first timer round
    (a minute) to act on it. Now a leader that takes office with work to do runs an
    early round at once (within early_round_delay)."""
    config = replace(CONFIG, db_path=str(tmp_path / "sia.db"), round_duration=3600.0,
                     early_round_delay=0.2)
    async with Controller(config) as c, AsyncSiaClient(f"127.0.0.1:{c.port}") as sia:
        await sia.submit(spec("waiting"))
    async with Controller(config) as c:
        await until(lambda: _took_office(c), timeout=10)


async def _took_office(c: Controller) -> bool:
    return any(r.trigger == "took office" for r in c.rounds)
