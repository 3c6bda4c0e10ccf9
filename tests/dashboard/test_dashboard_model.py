"""The dashboard's pure parts: the model it builds from the API's events (allocation
history, reasons), the fragments it draws, and the hub's treatment of a slow page."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sia_grpc.api import OTHER_TENANT, pb
from sia_grpc.dashboard import charts, job_page, render, style
from sia_grpc.dashboard.feed import Hub
from sia_grpc.dashboard.model import MAX_QUEUE_SAMPLES, UNITS, Model, Rate, Restart, Step, Use

KIND = pb.JobEvent


def job(job_id: str = "j1", *, revision: int = 1, gpus: int = 0, gpu_type: str = "rtx",
        state: int = pb.JOB_STATE_QUEUED, reason: str = "", created: float = 100.0,
        started: float = 0.0, tenant: str = "", **status: float) -> pb.Job:
    j = pb.Job(job_id=job_id, revision=revision, spec=pb.JobSpec(name=job_id, tenant=tenant),
               status=pb.JobStatus(state=state, reason=reason, **status))
    j.status.create_time.FromNanoseconds(int(created * 1e9))
    if started:
        j.status.start_time.FromNanoseconds(int(started * 1e9))
    if gpus:
        j.status.allocation.CopyFrom(pb.Allocation(gpu_type=gpu_type, num_gpus=gpus))
    return j


def event(j: pb.Job, kind: int = KIND.KIND_UPDATED) -> pb.JobEvent:
    return pb.JobEvent(kind=kind, revision=j.revision, job=j)


def test_a_snapshot_starts_the_history_at_create_and_start_times():
    m = Model()
    rec = m.apply(event(job(gpus=4, started=130.0, state=pb.JOB_STATE_RUNNING),
                        KIND.KIND_SNAPSHOT), now=500.0)
    assert rec.history == [Step(100.0, "", 0), Step(130.0, "rtx", 4)]
    assert rec.seen_from == 500.0


def test_live_changes_add_steps_when_the_allocation_changes():
    m = Model()
    m.apply(event(job(), KIND.KIND_CREATED), now=100.0)
    m.apply(event(job(revision=2, gpus=1, state=pb.JOB_STATE_RUNNING, reason="started")),
            now=110.0)
    m.apply(event(job(revision=3, gpus=1, state=pb.JOB_STATE_RUNNING, reason="kept")),
            now=120.0)
    rec = m.apply(event(job(revision=4, gpus=2, gpu_type="a100", state=pb.JOB_STATE_RUNNING,
                            reason="moved to a100")), now=130.0)
    assert rec.history == [Step(100.0, "", 0), Step(110.0, "rtx", 1), Step(130.0, "a100", 2)]
    assert [(n.at, n.state, n.text) for n in rec.notes] == [
        (110.0, "RUNNING", "started"), (120.0, "RUNNING", "kept"),
        (130.0, "RUNNING", "moved to a100")]
    # An older version arriving late (a snapshot after a reconnect) changes nothing.
    m.apply(event(job(revision=2, gpus=1), KIND.KIND_SNAPSHOT), now=140.0)
    assert m.jobs["j1"].allocation() == ("a100", 2)
    assert m.apply(event(job(revision=5), KIND.KIND_DELETED), now=150.0) is None
    assert m.jobs == {} and m.revision == 5


@given(st.lists(st.tuples(st.sampled_from(["", "rtx", "a100"]), st.integers(0, 8),
                          st.floats(0, 50)), max_size=30))
def test_history_steps_always_differ_and_never_go_back_in_time(changes):
    m = Model()
    now, rec = 100.0, m.apply(event(job(), KIND.KIND_CREATED), now=100.0)
    for rev, (gpu_type, gpus, dt) in enumerate(changes, start=2):
        now += dt
        rec = m.apply(event(job(revision=rev, gpus=gpus if gpu_type else 0,
                                gpu_type=gpu_type)), now=now)
    pairs = list(zip(rec.history, rec.history[1:], strict=False))
    assert all((a.gpu_type, a.num_gpus) != (b.gpu_type, b.num_gpus) for a, b in pairs)
    assert all(a.at <= b.at for a, b in pairs)
    assert (rec.history[-1].gpu_type, rec.history[-1].num_gpus) == rec.allocation()


def test_keep_only_forgets_jobs_deleted_while_away_and_rounds_are_not_repeated():
    m = Model()
    for j in ("a", "b", "c"):
        m.apply(event(job(j), KIND.KIND_SNAPSHOT), now=1.0)
    assert m.keep_only({"a", "c"}) == ["b"] and set(m.jobs) == {"a", "c"}
    assert m.add_round(pb.Round(round=7)) and not m.add_round(pb.Round(round=7))


def cluster() -> pb.Cluster:
    def node(name, state, holders, reason="", isolation="sandbox"):
        return pb.Node(name=name, gpu_type="rtx", num_gpus=len(holders), state=state,
                       drain_reason=reason, isolation=isolation,
                       gpus=[pb.GpuSlot(index=i, job_id=h) for i, h in enumerate(holders)])
    return pb.Cluster(policy="sia", round_duration_s=60, nodes=[
        node("n0", pb.NODE_STATE_READY, ["j1", "j1", OTHER_TENANT, ""]),
        node("n1", pb.NODE_STATE_DRAINING, ["", ""], "replace GPU 3", "none"),
        node("n2", pb.NODE_STATE_LOST, ["", ""], "missed heartbeats", "")],
        types=[pb.GpuTypeSummary(gpu_type="rtx", nodes=3, gpus=8, allocated=3)])


def test_the_cluster_grid_marks_holders_other_tenants_and_drained_and_lost_nodes():
    m = Model()
    m.cluster = cluster()
    m.apply(event(job("j1"), KIND.KIND_SNAPSHOT), now=1.0)
    html = render.cluster_section(m, now=2.0)
    assert re.findall(r'class="gpu (\w+)" data-job="([^"]*)"', html) == [
        ("held", "j1"), ("held", "j1"), ("other", OTHER_TENANT), ("free", ""),
        ("free", ""), ("free", ""), ("free", ""), ("free", "")]
    assert re.findall(r'<tr class="node (\w+)"', html) == ["ready", "draining", "lost"]
    # Each node says how its agent separates jobs; none stands out.
    assert re.findall(r'data-isolation="(\w+)"', html) == ["sandbox", "none", "unknown"]
    assert '<span class="isolation none"' in html
    assert "DRAINING: replace GPU 3" in html and "LOST: missed heartbeats" in html
    assert '<b class="allocated">3</b> allocated · <b class="free">5</b> free' in html
    bg, fg = style.job_colour("j1")
    assert f"background:{bg};color:{fg}" in html and (bg, fg) in style.PALETTE


def test_the_allocation_chart_draws_one_coloured_step_per_allocation():
    history = [Step(0.0, "", 0), Step(10.0, "rtx", 2), Step(20.0, "a100", 4),
               Step(30.0, "", 0)]
    colours = style.type_colours(["rtx", "a100"])
    svg = charts.allocation_chart(history, 40.0, colours)
    steps = re.findall(r'class="alloc-step" data-type="(\w+)" data-gpus="(\d)" '
                       r'x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', svg)
    assert [(t, n) for t, n, _, _ in steps] == [("rtx", "2"), ("a100", "4")]
    assert "a100</span>" in svg and "rtx</span>" in svg  # the legend
    (x1, w1), (x2, w2) = [(float(x), float(w)) for _, _, x, w in steps]
    assert w1 == w2 and x2 == x1 + w1  # 10 s each, one after the other
    assert f'fill="{colours["a100"]}"' in svg and colours["a100"] != colours["rtx"]


async def test_a_page_that_falls_behind_is_closed_not_waited_for():
    hub = Hub()
    slow, fast = hub.subscribe(), hub.subscribe()
    for i in range(2 * 2000):
        hub.publish("job", {"id": str(i)})
        if not fast.empty():
            fast.get_nowait()
    items = []
    while not slow.empty():
        items.append(slow.get_nowait())
    assert items[-1] is None  # its stream ends; the page reconnects and reloads
    hub.publish("job", {"id": "after"})
    assert slow.empty() and await asyncio.wait_for(fast.get(), 1) == (
        b'event: job\ndata: {"id":"after"}\n\n')


def test_the_panels_over_time_follow_each_types_allocation_and_the_jobs_by_activity():
    m = Model()
    m.cluster = cluster()
    m.apply(event(job("j1")), now=1.0)
    assert m.sample(10.0) and not m.sample(20.0)  # nothing changed the second time
    m.cluster.types[0].allocated = 5
    m.apply(event(job("j1", revision=2, state=pb.JOB_STATE_RUNNING, gpus=5)), now=25.0)
    assert m.sample(30.0)
    assert m.allocated == {"rtx": [Step(10.0, "rtx", 3), Step(30.0, "rtx", 5)]}
    assert m.jobs_by == {"waiting": [Step(10.0, "waiting", 1), Step(30.0, "waiting", 0)],
                         "running": [Step(10.0, "running", 0), Step(30.0, "running", 1)]}
    html = render.cluster_section(m, now=40.0)
    assert "rtx: GPUs allocated of 8" in html and "<title>capacity 8</title>" in html
    assert re.findall(r'"alloc-step" data-type="rtx" data-gpus="(\d)"', html) == ["3", "5"]


RUNNING, RESTARTING = pb.JOB_STATE_RUNNING, pb.JOB_STATE_RESTARTING


def test_a_jobs_goodput_throughput_and_restarts_follow_its_versions():
    m = Model()
    m.apply(event(job(), KIND.KIND_CREATED), now=100.0)
    versions = [  # (now, the job's status then)
        (110.0, dict(state=RUNNING, gpus=2, generation=1, goodput=100.0)),
        (120.0, dict(state=RUNNING, gpus=2, generation=1, goodput=100.0, throughput=90.0)),
        (125.0, dict(state=RUNNING, gpus=2, generation=1, goodput=100.0, throughput=90.0)),
        # A move: checkpointing (the GPUs still held), then on 4 a100, then measured.
        (130.0, dict(state=RESTARTING, gpus=2, generation=1, goodput=100.0, restarts=1)),
        (140.0, dict(state=RUNNING, gpus=4, gpu_type="a100", generation=2, goodput=300.0,
                     restarts=1)),
        (150.0, dict(state=RUNNING, gpus=4, gpu_type="a100", generation=2, goodput=300.0,
                     restarts=1, throughput=280.0, restart_seconds=20.0))]
    for rev, (now, status) in enumerate(versions, start=2):
        rec = m.apply(event(job(revision=rev, **status)), now=now)
    assert rec.rates == [Rate(110.0, 100.0, 0.0), Rate(120.0, 100.0, 90.0),
                         Rate(130.0, 100.0, 0.0), Rate(140.0, 300.0, 0.0),
                         Rate(150.0, 300.0, 280.0)]
    assert rec.restarts == [Restart(130.0, 1, ("rtx", 2), ("a100", 4), 20.0)]
    # Requeued from a lost node (its GPUs gone at once, the generation fenced): not yet
    # running, not yet measured.
    rec = m.apply(event(job(revision=9, generation=3, goodput=300.0, restarts=2,
                            restart_seconds=20.0)), now=160.0)
    assert rec.restarts[-1] == Restart(160.0, 2, ("a100", 4))
    cells = r'<td class="from">(.*?)</td><td class="to">(.*?)</td><td class="cost">(.*?)</td>'
    assert re.findall(cells, job_page.restarts_table(rec.restarts)) == [
        ("4 a100", "not running yet", "measuring"), ("2 rtx", "4 a100", "20.0 s")]
    # Moved again before it reported a step where it was going: that one is never measured.
    rec = m.apply(event(job(revision=10, state=RUNNING, gpus=1, generation=4, goodput=50.0,
                            restarts=2, restart_seconds=20.0)), now=170.0)
    rec = m.apply(event(job(revision=11, state=RESTARTING, gpus=1, generation=4,
                            goodput=50.0, restarts=3, restart_seconds=20.0)), now=175.0)
    assert re.findall(cells, job_page.restarts_table(rec.restarts))[:2] == [
        ("1 rtx", "not running yet", "measuring"),
        ("4 a100", "1 rtx", "none: restarted again before its first step")]


def test_a_snapshot_after_the_dashboard_was_away_may_say_a_whole_restart_at_once():
    m = Model()
    m.apply(event(job(state=RUNNING, gpus=2, generation=1)), now=100.0)
    rec = m.apply(event(job(revision=5, state=RUNNING, gpus=4, gpu_type="a100", generation=2,
                            restarts=1, restart_seconds=12.5), KIND.KIND_SNAPSHOT), now=200.0)
    assert rec.restarts == [Restart(200.0, 1, ("rtx", 2), ("a100", 4), 12.5)]


@given(st.lists(st.tuples(st.floats(0, 50), st.sampled_from([0.0, 10.0, 20.0]),
                          st.sampled_from([0.0, 5.0, 9.0]), st.booleans()), max_size=30))
def test_rates_always_differ_never_go_back_in_time_and_each_restart_is_one_row(changes):
    m = Model()
    now, rec = 100.0, m.apply(event(job(), KIND.KIND_CREATED), now=100.0)
    restarts = 0
    for rev, (dt, goodput, throughput, restarted) in enumerate(changes, start=2):
        now, restarts = now + dt, restarts + restarted
        rec = m.apply(event(job(revision=rev, goodput=goodput, throughput=throughput,
                                restarts=restarts)), now=now)
    pairs = list(zip(rec.rates, rec.rates[1:], strict=False))
    assert all((a.goodput, a.throughput) != (b.goodput, b.throughput) for a, b in pairs)
    assert all(a.at <= b.at for a, b in pairs)
    last = rec.rates[-1] if rec.rates else Rate(0.0, 0.0, 0.0)
    assert (last.goodput, last.throughput) == (rec.job.status.goodput,
                                               rec.job.status.throughput)
    assert len(rec.restarts) == restarts


def test_the_rate_chart_draws_the_estimate_and_the_throughput_apart_with_a_legend():
    rates = [Rate(0.0, 100.0, 0.0), Rate(10.0, 100.0, 80.0), Rate(20.0, 300.0, 250.0)]
    svg = charts.rate_chart(rates, 40.0)
    lines = dict(re.findall(r'<polyline class="rate" data-series="(\w+)"[^>]* stroke="'
                            r'(#\w+)"', svg))
    assert set(lines) == {"goodput", "throughput"} and len(set(lines.values())) == 2
    assert 'stroke-dasharray="6 3"' in svg  # told apart without their colours too
    assert "goodput (scheduler&#x27;s estimate)" in svg and "throughput (reported)" in svg
    assert "samples/s" in svg and ">300<" in svg  # the unit, the top of the scale
    # Each line holds its value until the next change: 3 steps of 2 points each.
    (points,) = re.findall(r'data-series="throughput".*? points="([^"]+)"', svg)
    assert len(points.split()) == 6
    assert "no goodput estimate" in charts.rate_chart([], 40.0)


def queues(held: dict[str, int], borrowed: dict[str, int] | None = None, *, pending: int = 0,
           units: float = 0.0, held_units: float = 0.0) -> pb.ListQueuesResponse:
    spec = pb.QueueSpec(name="research", guarantee={"rtx": 4}, guarantee_units=units)
    return pb.ListQueuesResponse(queues=[pb.QueueStatus(
        spec=spec, held=held, borrowed=borrowed or {}, held_units=held_units,
        pending_jobs=pending)])


def test_queue_use_over_time_follows_what_each_queue_holds_against_its_guarantee():
    m = Model()
    m.queues = queues({})
    assert m.sample_queues(10.0) and not m.sample_queues(20.0)  # nothing changed then
    m.queues = queues({"rtx": 6, "aws": 2}, {"rtx": 2, "aws": 2}, pending=3)
    assert m.sample_queues(30.0)
    m.queues = queues({"rtx": 1})  # aws no longer held: noted at 0
    assert m.sample_queues(40.0)
    use = m.queue_use["research"]
    assert use.use["rtx"] == [Use(10.0, 0, 4), Use(30.0, 6, 4, 2), Use(40.0, 1, 4)]
    assert use.use["aws"] == [Use(30.0, 2, 0, 2), Use(40.0, 0, 0)]
    assert use.pending == [Step(10.0, "pending", 0), Step(30.0, "pending", 3),
                           Step(40.0, "pending", 0)]
    assert UNITS not in use.use  # no type-flexible guarantee: no units series
    m.queues = queues({"rtx": 1}, units=6.0, held_units=1.5)
    assert m.sample_queues(50.0) and use.use[UNITS] == [Use(50.0, 1.5, 6.0)]
    for k in range(MAX_QUEUE_SAMPLES + 10):  # each series keeps its newest changes
        m.queues = queues({"rtx": k % 2}, pending=k % 2)
        m.sample_queues(60.0 + k)
    assert len(use.use["rtx"]) == len(use.pending) == MAX_QUEUE_SAMPLES
    assert use.pending[-1].at == 60.0 + MAX_QUEUE_SAMPLES + 9


def test_a_queues_chart_draws_its_held_bars_borrowing_hatched_and_its_guarantee_line():
    m = Model()
    m.cluster = cluster()
    m.queues = queues({"rtx": 2})
    m.sample_queues(10.0)
    m.queues = queues({"rtx": 6}, {"rtx": 2}, pending=1, units=6.0, held_units=6.0)
    m.sample_queues(20.0)
    html = render.queues_section(m, now=30.0)
    (group,) = re.findall(r'<div class="queue-use" data-queue="(\w+)"><h3>queue research</h3>',
                          html)
    assert group == "research"  # labelled by its name, not told apart by colour
    assert "rtx GPUs: 6 held of 4 guaranteed, 2 borrowed" in html
    assert "units (type-flexible guarantee): 6 held of 6 guaranteed" in html
    assert "jobs pending: 1" in html
    units = html.index("units (type-flexible guarantee) held over time")
    rtx = html[html.index("rtx GPUs held over time"):units]
    assert re.findall(r'class="held" data-held="(\d+)"', rtx) == ["2", "6"]
    assert re.findall(r'class="borrowed" data-borrowed="(\d+)"', rtx) == ["2"]
    assert 'class="guarantee" data-guarantee="4"' in rtx and ">guarantee 4</text>" in rtx
    # The guarantee's line is at 4 on the chart's scale (0 to 6).
    (points,) = re.findall(r'class="guarantee" data-guarantee="4" points="([^"]+)"', rtx)
    (y,) = {float(p.split(",")[1]) for p in points.split()}
    (y0,) = re.findall(r'y1="([\d.]+)" x2="\d+" y2="[\d.]+" class="axis"', rtx)
    assert y == pytest.approx(8 + (float(y0) - 8) * (1 - 4 / 6), abs=0.1)  # (pad_t 8)


def test_a_rounds_row_lists_the_jobs_it_moved_with_links_from_and_to():
    def alloc(gpu_type: str, n: int, node: str) -> pb.Allocation:
        return pb.Allocation(gpu_type=gpu_type, num_gpus=n,
                             gpus=[pb.GpuRef(node=node, index=i) for i in range(n)])

    rnd = pb.Round(round=9, trigger="drain", jobs_moved=3, total_ms=12.5, moves=[
        pb.RoundMove(job_id="j1", name="bert", kind="move", before=alloc("rtx", 2, "r0"),
                     after=alloc("aws", 4, "a1")),
        pb.RoundMove(job_id="j2", name="", kind="preempt", before=alloc("rtx", 1, "r1")),
        pb.RoundMove(job_id=OTHER_TENANT, kind="start", after=alloc("rtx", 1, "r1"))])
    html = render.round_row(rnd)
    assert html.startswith('<tbody class="round" data-round="9">')
    items = re.findall(r'<li class="move" data-job="([^"]+)" data-kind="(\w+)">(.*?)</li>', html)
    assert [(j, k) for j, k, _ in items] == [("j1", "move"), ("j2", "preempt"),
                                             (OTHER_TENANT, "start")]
    texts = [re.sub(r"<[^>]+>", "", t) for _, _, t in items]
    assert texts == ["move bert 2 rtx on r0 → 4 aws on a1", "preempt j2 1 rtx on r1 → queued",
                     "start another tenant's job - → 1 rtx on r1"]
    assert '<a href="/jobs/j1" title="j1">bert</a>' in html
    assert "/jobs/(other" not in html  # another tenant's job: no link
    many = pb.Round(round=10, moves=[pb.RoundMove(job_id=f"j{i}", kind="start")
                                     for i in range(render.MOVES_SHOWN + 3)])
    assert "and 3 more" in render.round_row(many)
    # The controller lists the first 20 of a round's moves; the rest are counted.
    assert "and 5 more" in render.round_row(pb.Round(round=12, jobs_moved=7, moves=[
        pb.RoundMove(job_id="j1", kind="start"), pb.RoundMove(job_id="j2", kind="start")]))
    assert "ul" not in render.round_row(pb.Round(round=11))  # no moves: no list
