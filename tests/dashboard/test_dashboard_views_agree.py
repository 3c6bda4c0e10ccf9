"""Issue 37, items 7 and 8: the dashboard's queues page and job page say what the
controller says, and no more. A type-flexible guarantee is shown in units, borrowing
as the controller counts it; a job's priority class by its name; a job's history is
not drawn before the job started, nor invented for the time before the dashboard saw
it (that span is drawn as unknown)."""

from __future__ import annotations

import re

from sia_grpc.api import pb
from sia_grpc.dashboard import charts, job_page, render
from sia_grpc.dashboard.model import UNKNOWN, Model, Step

KIND = pb.JobEvent


def flexible_queues() -> pb.ListQueuesResponse:
    """A queue guaranteed 4 units over any type holding 2 aws GPUs (within it: the
    controller counts nothing borrowed), beside the default queue, with no guarantee.
    The default priority class is called "normal"."""
    flex = pb.QueueStatus(spec=pb.QueueSpec(name="flex", guarantee_units=4.0),
                          held={"aws": 2}, held_units=2.0, running_jobs=1)
    default = pb.QueueStatus(spec=pb.QueueSpec(name="default"))
    return pb.ListQueuesResponse(queues=[flex, default], config=pb.QueueConfig(
        default_priority="normal", priority_class=[pb.PriorityClassSpec(name="normal")]))


def row(html: str, queue: str) -> str:
    (found,) = re.findall(rf'<tr data-queue="{queue}">(.*?)</tr>', html)
    return found


def test_a_type_flexible_guarantee_is_shown_in_units_and_not_as_borrowing():
    m = Model()
    m.queues = flexible_queues()
    m.sample_queues(10.0)
    html = render.queues_section(m, now=20.0)
    flex = row(html, "flex")
    assert "4 units (any type)" in flex  # not "-"
    assert "2/0" not in flex and 'class="use over"' not in flex  # not "borrowing aws 2/0"
    assert "2/4 units" in flex  # held against the guarantee, in units
    assert "aws GPUs: 2 held of 0 guaranteed" not in html
    # What the controller counts as borrowed is what is shown as borrowed.
    m.queues.queues[0].borrowed["aws"] = 1
    assert 'class="use over"' in row(render.queues_section(m, now=20.0), "flex")


def test_no_borrowed_column_when_no_queue_has_a_guarantee():
    m = Model()
    m.queues = pb.ListQueuesResponse(queues=[pb.QueueStatus(spec=pb.QueueSpec(name="default"))])
    assert "BORROWED" not in render.queues_section(m, now=1.0)
    m.queues = flexible_queues()
    assert "BORROWED" in render.queues_section(m, now=1.0)


def job(*, created: float = 100.0, started: float = 0.0, updated: float = 0.0,
        gpus: int = 0, generation: int = 0, priority: str = "") -> pb.Job:
    state = pb.JOB_STATE_RUNNING if gpus else pb.JOB_STATE_QUEUED
    j = pb.Job(job_id="j1", revision=1, spec=pb.JobSpec(name="j1", priority=priority),
               status=pb.JobStatus(state=state, generation=generation))
    for field, at in (("create_time", created), ("start_time", started),
                      ("update_time", updated)):
        if at:
            getattr(j.status, field).FromNanoseconds(int(at * 1e9))
    if gpus:
        j.status.allocation.CopyFrom(pb.Allocation(gpu_type="rtx", num_gpus=gpus))
    return j


def test_the_job_page_names_the_default_priority_class():
    m = Model()
    m.queues = flexible_queues()
    rec = m.apply(KIND(kind=KIND.KIND_SNAPSHOT, revision=1, job=job()), now=200.0)
    assert rec is not None
    assert "<dt>priority</dt><dd>normal</dd>" in job_page.job_detail(rec, m, now=200.0)
    rec.job.spec.priority = "urgent"
    assert "<dt>priority</dt><dd>urgent</dd>" in job_page.job_detail(rec, m, now=200.0)


def test_a_job_seen_mid_run_after_a_restart_is_not_drawn_before_it_was_known():
    """Started at 130 on some GPUs, restarted since (generation 2) onto 4 rtx: what it
    held between 130 and its last change (300) is unknown, not the 4 rtx of now."""
    m = Model()
    rec = m.apply(KIND(kind=KIND.KIND_SNAPSHOT, revision=1, job=job(
        started=130.0, updated=300.0, gpus=4, generation=2)), now=500.0)
    assert rec is not None
    assert rec.history == [Step(100.0, "", 0), Step(130.0, UNKNOWN, 0),
                           Step(300.0, "rtx", 4)]
    svg = charts.allocation_chart(rec.history, 600.0, {"rtx": "#123456"})
    assert re.findall(r'data-type="rtx" data-gpus="4"', svg) == ['data-type="rtx" data-gpus="4"']
    assert 'class="unknown"' in svg  # the gap, drawn as not known
    # No drawn allocation starts before the job's start.
    starts = [float(x) for x in re.findall(r'class="alloc-step"[^>]* x="([\d.]+)"', svg)]
    (unknown_x,) = re.findall(r'class="unknown"[^>]* x="([\d.]+)"', svg)
    assert starts and min(starts) > float(unknown_x)


def test_a_job_never_started_or_on_its_first_allocation_needs_no_unknown_span():
    m = Model()
    first = m.apply(KIND(kind=KIND.KIND_SNAPSHOT, revision=1, job=job(
        started=130.0, updated=300.0, gpus=4, generation=1)), now=500.0)
    assert first is not None and first.history == [Step(100.0, "", 0), Step(130.0, "rtx", 4)]
    m = Model()
    queued = m.apply(KIND(kind=KIND.KIND_SNAPSHOT, revision=1, job=job(updated=120.0)),
                     now=500.0)
    assert queued is not None and queued.history == [Step(100.0, "", 0)]
    # Preempted since it started (it holds nothing now): what it held is unknown until
    # its last change.
    m = Model()
    back = m.apply(KIND(kind=KIND.KIND_SNAPSHOT, revision=1, job=job(
        started=130.0, updated=300.0, generation=2)), now=500.0)
    assert back is not None
    assert back.history == [Step(100.0, "", 0), Step(130.0, UNKNOWN, 0), Step(300.0, "", 0)]


def test_a_move_missed_while_the_dashboard_was_away_is_a_gap_not_the_old_allocation():
    """Seen on 2 rtx until 600; the watch drops; the snapshot after it (at 900) says 4
    a100 since 800, generation 2: from 600 to 800 what it held is not known."""
    m = Model()
    m.apply(KIND(kind=KIND.KIND_SNAPSHOT, revision=1, job=job(
        started=130.0, updated=130.0, gpus=2, generation=1)), now=500.0)
    m.apply(KIND(kind=KIND.KIND_UPDATED, revision=2, job=job(
        started=130.0, updated=600.0, gpus=2, generation=1)), now=600.0)
    moved = job(started=130.0, updated=800.0, gpus=4, generation=2)
    moved.revision = 3
    moved.status.allocation.gpu_type = "a100"
    rec = m.apply(KIND(kind=KIND.KIND_SNAPSHOT, revision=3, job=moved), now=900.0)
    assert rec is not None
    assert rec.history == [Step(100.0, "", 0), Step(130.0, "rtx", 2), Step(600.0, UNKNOWN, 0),
                           Step(800.0, "a100", 4)]
    # The same version again (another reconnect): nothing new.
    m.apply(KIND(kind=KIND.KIND_SNAPSHOT, revision=3, job=moved), now=950.0)
    assert len(rec.history) == 4
