"""Queues in the controller: configuration, admission, what the state machine gives the
policy and what it makes of a round (reasons, reclaims, binding rows), driven with no
sockets."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import grpc
import pytest
from harness import Harness
from hypothesis import given
from hypothesis import strategies as st

from sia_grpc.api import pb
from sia_grpc.api.convert import queues_from_pb, queues_to_pb
from sia_grpc.api.errors import ApiError
from sia_grpc.controller.config import ConfigError, load_config, read_queues_file
from sia_grpc.controller.machine.profiling import PROFILE_SLOT
from sia_grpc.controller.machine.state import QueuesLoaded
from sia_grpc.controller.machine.validation import admit_to_queue
from sia_grpc.policy.cluster import Config, GpuId
from sia_grpc.policy.queues import PriorityClass, Queue, QueueSet
from sia_grpc.policy.queues.outcome import borrowed, outcome
from sia_grpc.policy.types import JobAllocation, PolicyJob, RoundResult

RESEARCH = QueueSet(queues=(Queue("research", tenants={"team-a"}, guarantee={"rtx": 8}),
                            Queue("batch", borrow_limit={"rtx": 4})),
                    priority_classes=(PriorityClass("production", 10.0),))
FLAT = QueueSet(queues=(Queue("research", tenants={"team-a"}), Queue("batch")),
                priority_classes=(PriorityClass("production", 10.0),))  # no rows: no solver
RIGID4 = dict(adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=4, batch_size=512)


# ---------------------------------------------------------------- configuration


def test_a_queues_table_in_the_controller_config(tmp_path):
    path = tmp_path / "controller.toml"
    path.write_text('[controller]\nround_duration = 30\n\n[[queues.queue]]\nname = "research"\n'
                    'tenants = ["team-a"]\nguarantee = {rtx = 8}\n\n[[queues.priority_class]]\n'
                    'name = "production"\nweight = 10\n')
    cfg = load_config(path, env={})
    assert cfg.queues.queue("research").guarantee == {"rtx": 8}
    assert cfg.queues.weight("production") == 10.0
    assert load_config(None, env={}).queues == QueueSet()  # none: one flat default queue


@pytest.mark.parametrize("text, message", [
    ('[[queues.queue]]\nname = "a"\n[[queues.queue]]\nname = "b"\nguarantee = {rtx = -1}\n',
     "queues.queue[1].guarantee.rtx: must be a whole number of GPUs >= 0, got -1"),
    ('[[queues.queue]]\nname = "a"\ngarantee = {rtx = 1}\n',
     "queues.queue[0].garantee: unknown key"),
    ('queues = 3\n', "queues: expected a table"),
    ('[queues]\nunit_weights = {rtx = 0}\n', "queues.unit_weights.rtx: must be a positive"),
])
def test_a_bad_queues_table_names_the_key(tmp_path, text, message):
    path = tmp_path / "controller.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert str(err.value).startswith(f"{path}: {message}"), err.value


def test_a_queues_file_names_itself_and_the_key(tmp_path):
    path = tmp_path / "queues.toml"
    path.write_text('[[queue]]\nname = "a"\nborrow_limit = {rtx = 1.5}\n')
    with pytest.raises(ConfigError) as err:
        read_queues_file(path)
    assert str(err.value).startswith(f"queues_file: {path}: queue[0].borrow_limit.rtx: ")
    path.write_text('[[queue]]\nname = "a"\nguarantee = {rtx = 2}\n')
    assert read_queues_file(path).queue("a").guarantee == {"rtx": 2}
    cfg = load_config(None, env={"SIA_QUEUES_FILE": str(path)})
    assert cfg.queues_file == str(path)


def test_the_operations_guides_queues_file_reads_as_it_says(tmp_path):
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    example = re.search(r"```toml\n(# /etc/sia/queues.toml.*?)```", text, re.S).group(1)
    path = tmp_path / "queues.toml"
    path.write_text(example)
    qs = read_queues_file(path)
    assert [q.name for q in qs.queues] == ["research", "nlp", "default"]
    assert qs.queue("research").cap("rtx") == 24 and qs.queue("nlp").guarantee_units == 12
    assert (qs.default_priority, qs.max_restarts_per_round, qs.min_runtime("nlp")) == \
        ("batch", 4, 1800)


def test_queues_in_the_config_and_a_queues_file_are_refused(tmp_path):
    path = tmp_path / "controller.toml"
    path.write_text('queues_file = "q.toml"\n[[queues.queue]]\nname = "a"\n')
    with pytest.raises(ConfigError, match="queues_file: the queues are given twice"):
        load_config(path, env={})


# ---------------------------------------------------------------- the wire form


names = st.text("abcxyz-", min_size=1, max_size=6).map(lambda s: "q" + s)
counts = st.dictionaries(st.sampled_from(["rtx", "aws", "dgx"]), st.integers(0, 64), max_size=3)


@given(st.lists(st.tuples(names, st.frozensets(names, max_size=2), counts,
                          st.floats(0, 100), counts, st.none() | st.floats(0, 1e4)),
                max_size=4, unique_by=lambda q: q[0]),
       st.lists(st.tuples(names, st.floats(0.01, 100)), max_size=3, unique_by=lambda c: c[0]),
       st.dictionaries(st.sampled_from(["rtx", "aws"]), st.floats(0.1, 10), max_size=2),
       st.floats(0, 1e4), st.none() | st.integers(0, 100))
def test_a_queue_set_survives_the_wire_unchanged(queues, classes, weights, runtime, restarts):
    qs = QueueSet(queues=tuple(Queue(n, tenants=t, guarantee=g, guarantee_units=u,
                                     borrow_limit=b, min_runtime_s=m)
                               for n, t, g, u, b, m in queues),
                  priority_classes=tuple(PriorityClass(n, w) for n, w in classes),
                  unit_weights=weights, min_runtime_s=runtime, max_restarts_per_round=restarts)
    assert queues_from_pb(queues_to_pb(qs)) == qs


def test_a_bad_queue_config_on_the_wire_names_the_same_path_as_the_file():
    cfg = pb.QueueConfig(queue=[pb.QueueSpec(name="ok"), pb.QueueSpec(name="bad name")])
    with pytest.raises(ApiError) as err:
        queues_from_pb(cfg)
    assert err.value.field == "queues.queue[1].name"
    with pytest.raises(ApiError) as err:
        queues_from_pb(pb.QueueConfig(unit_weights={"rtx": -1.0}))
    assert err.value.field == "queues.unit_weights.rtx"


# ---------------------------------------------------------------- admission


@pytest.mark.parametrize("spec, bound, code, field_or_reason", [
    (pb.JobSpec(queue="nope", tenant="team-a"), (), "INVALID_ARGUMENT", "spec.queue"),
    (pb.JobSpec(queue="research", priority="urgent", tenant="team-a"), (), "INVALID_ARGUMENT",
     "spec.priority"),
    (pb.JobSpec(queue="research", tenant="team-b"), (), "PERMISSION_DENIED", "QUEUE_DENIED"),
    (pb.JobSpec(queue="batch", tenant="team-a"), ("research",), "PERMISSION_DENIED",
     "QUEUE_DENIED"),
])
def test_admission_refuses_with_a_typed_error(spec, bound, code, field_or_reason):
    with pytest.raises(ApiError) as err:
        admit_to_queue(spec, RESEARCH, bound)
    assert err.value.code == getattr(grpc.StatusCode, code)
    assert field_or_reason in (err.value.field, err.value.reason), err.value


def test_admission_defaults_to_the_tokens_first_queue_else_default():
    spec = pb.JobSpec(tenant="team-a")
    admit_to_queue(spec, RESEARCH, ("research", "batch"))
    assert spec.queue == "research"
    spec = pb.JobSpec(tenant="team-b", priority="production")
    admit_to_queue(spec, RESEARCH)
    assert spec.queue == ""  # the default queue, admitting every tenant


# ---------------------------------------------------------------- the round's inputs


def _running(h: Harness, *jobs: tuple[str, str]) -> None:
    """Submit (job id, queue) rigid 4-GPU jobs and run a round so they start."""
    for job_id, queue in jobs:
        h.submit(job_id, queue=queue, tenant="team-a", **RIGID4)
    h.deliver()
    h.tick()
    h.deliver()


def test_the_solve_carries_the_queues_and_each_jobs_queue_class_and_stint():
    h = Harness({"rtx-0": ("rtx", 8)}, queues=FLAT)
    h.submit("r0", queue="research", priority="production", tenant="team-a", **RIGID4)
    h.submit("d0", **RIGID4)
    h.deliver()
    h.tick()
    h.deliver()
    started = h.state.jobs["r0"].started_at
    h.tick(30.0)
    solve = h.solves[-1]
    assert solve.queues == FLAT
    jobs = {j.job_id: j for j in solve.jobs}
    assert (jobs["r0"].queue, jobs["r0"].priority) == ("research", "production")
    assert (jobs["d0"].queue, jobs["d0"].priority) == ("default", "")
    assert jobs["r0"].stint == pytest.approx(h.now - started) and jobs["r0"].stint > 0


def test_without_a_queue_configuration_the_policy_sees_no_queues():
    h = Harness({"rtx-0": ("rtx", 8)})
    _running(h, ("d0", ""))
    assert h.solves and all(s.queues is None for s in h.solves)


def test_a_queue_removed_by_a_reload_schedules_its_jobs_in_default_and_says_so():
    h = Harness({"rtx-0": ("rtx", 8)}, queues=FLAT)
    _running(h, ("r0", "research"))
    h.feed(QueuesLoaded(h.now, QueueSet(queues=(Queue("batch"),))))
    h.tick()
    (job,) = h.solves[-1].jobs
    assert job.queue == "default"
    reason = h.state.jobs["r0"].job.status.reason
    assert reason.startswith("kept 4 rtx") and reason.endswith(
        "(queue 'research' is no longer configured: scheduled in default)"), reason
    assert h.state.jobs["r0"].job.spec.queue == "research"  # what was submitted stays
    h.feed(QueuesLoaded(h.now, FLAT))  # back: in its queue again
    h.tick()
    assert h.solves[-1].jobs[0].queue == "research"
    assert h.state.jobs["r0"].job.status.reason == "kept 4 rtx, batch 512"


def test_queues_pb_counts_held_borrowed_and_waiting_jobs():
    h = Harness({"rtx-0": ("rtx", 8)}, queues=FLAT)
    _running(h, ("b0", "batch"), ("b1", "batch"))
    h.submit("r0", queue="research", tenant="team-a", **RIGID4)
    out = {q.spec.name: q for q in h.state.queues_pb().queues}
    assert dict(out["batch"].held) == {"rtx": 8} and dict(out["batch"].borrowed) == {"rtx": 8}
    assert (out["batch"].running_jobs, out["batch"].pending_jobs) == (2, 0)
    assert (out["research"].pending_jobs, dict(out["research"].held)) == (1, {})
    metrics = h.state.queue_metrics()
    assert metrics["held"]["batch", "rtx"] == 8 and metrics["held"]["research", "rtx"] == 0
    assert metrics["pending"] == {"research": 1, "batch": 0, "default": 0}


# ---------------------------------------------------------------- a round's outcome


def _job(job_id: str, queue: str) -> PolicyJob:
    return PolicyJob(job_id=job_id, model=None, queue=queue, allowed_types=frozenset({"rtx"}))


def _alloc(n: int) -> JobAllocation:
    return JobAllocation(config=Config("rtx", 1, n), gpus=tuple(GpuId("rtx-0", g)
                                                               for g in range(n)))


def test_outcome_names_the_reclaim_the_binding_row_and_the_rule_a_job_waits_on():
    jobs = [_job("b0", "batch"), _job("b1", "batch"), _job("r0", "research"),
            _job("r1", "research"), _job("r2", "research")]
    previous = {"b0": _alloc(4), "b1": _alloc(4)}  # batch borrows all 8
    result = RoundResult(
        allocations={"b1": _alloc(4), "r0": _alloc(4)}, restarted=frozenset({"b0"}),
        objective=0.0, timings={},
        reasons={"b0": "preempted: its GPUs are worth more to other jobs",
                 "b1": "kept 4 rtx, batch 512", "r0": "started on 4 rtx, batch 512",
                 "r1": "waiting: no GPUs free for it this round",
                 "r2": "waiting: no allowed GPU type can run it (no estimate)"},
        rows={"guarantee research/rtx": (-4.0, -4.0), "borrow batch/rtx": (4.0, 12.0)})
    quota = QueueSet(queues=(Queue("research", guarantee={"rtx": 4}), Queue("batch")))
    done = outcome(quota, result, jobs, previous, {"rtx": 8})
    assert done.binding == ("guarantee research/rtx",)
    assert done.reclaims == {"b0": "research"}
    assert done.reasons == {
        "b0": "preempted: queue research reclaims its guarantee of 4 rtx",
        "r1": "waiting: queue research is at its guarantee of 4 rtx and the cluster has "
              "nothing idle to lend"}  # (r2's own reason stays: no queue rule holds it)


def test_outcome_names_a_borrowing_limit_and_keeps_the_policys_reason_otherwise():
    jobs = [_job("b0", "batch"), _job("b1", "batch")]
    result = RoundResult(allocations={"b0": _alloc(4)}, restarted=frozenset(), objective=0.0,
                         timings={}, reasons={"b1": "waiting: no GPUs free for it this round"},
                         rows={"borrow batch/rtx": (4.0, 4.0)})
    done = outcome(RESEARCH, result, jobs, {}, {"rtx": 16})
    assert done.reasons == {"b1": "waiting: queue batch is at its borrowing limit of 4 rtx"}
    assert not done.reclaims and not done.binding
    # no guarantee nor limit anywhere: the flat pool's own reason
    flat = outcome(FLAT, dataclasses.replace(result, rows={}), jobs, {}, {"rtx": 4})
    assert flat.reasons == {}


# ---------------------------------------------------------------- reclaim, in the state machine


def test_a_queue_under_its_guarantee_reclaims_from_a_borrower():
    quota = QueueSet(queues=(Queue("research", guarantee={"rtx": 8}), Queue("batch")))
    h = Harness({"rtx-0": ("rtx", 8), "rtx-1": ("rtx", 8)}, queues=quota)
    _running(h, *[(f"b{k}", "batch") for k in range(4)])
    assert all(h.state_of(f"b{k}") == pb.JOB_STATE_RUNNING for k in range(4))
    for k in range(2):
        h.submit(f"r{k}", queue="research", **RIGID4)
    for _ in range(3):  # profiled (a profiling slot in a full cluster), then reclaimed
        h.tick()
        h.deliver()
        h.finish_profiles()
        h.deliver()
        if all(h.state_of(f"r{k}") == pb.JOB_STATE_RUNNING for k in range(2)):
            break
    reclaim = next(d for d in h.round_done if d.round.reclaims)
    assert list(reclaim.round.binding_rows) == ["guarantee research/rtx"]
    assert ("batch", "reclaim") in reclaim.preempted
    assert all(h.state_of(f"r{k}") == pb.JOB_STATE_RUNNING for k in range(2))
    waiting = [r.job.status.reason for r in h.state.jobs.values()
               if r.state == pb.JOB_STATE_QUEUED]
    # (the policy may also swap a borrower's job for another of its own: not a reclaim)
    assert "preempted: queue research reclaims its guarantee of 8 rtx" in waiting, waiting
    # ... and the history says so: a QueueReclaim per job that gave way, naming both
    reclaims = [e for e in h.happened if e.kind == pb.EVENT_KIND_QUEUE_RECLAIM]
    assert len(reclaims) == reclaim.round.reclaims and all(
        e.queue == "research" and e.job_id.startswith("b") and "(queue batch)" in e.message
        for e in reclaims), reclaims
    h.tick()
    h.deliver()
    waiting = [r.job.status.reason for r in h.state.jobs.values()
               if r.state == pb.JOB_STATE_QUEUED]
    assert waiting == ["waiting: queue batch has no guarantee of rtx and the cluster has "
                       "nothing idle to lend"] * 2, waiting
    held = {q.spec.name: dict(q.held) for q in h.state.queues_pb().queues}
    assert held["research"] == {"rtx": 8} and held["batch"] == {"rtx": 8}


def test_borrowed_is_beyond_the_per_type_guarantee_and_what_the_units_cover():
    qs = QueueSet(queues=(Queue("mixed", guarantee={"rtx": 4}, guarantee_units=8),
                          Queue("flex", guarantee_units=6), Queue("typed", guarantee={"rtx": 2})),
                  unit_weights={"dgx": 2.0})
    assert borrowed(qs, "typed", {"rtx": 5, "dgx": 1}) == {"rtx": 3, "dgx": 1}
    assert borrowed(qs, "flex", {"rtx": 2, "dgx": 2}) == {}  # 6 units: all covered
    assert borrowed(qs, "flex", {"rtx": 3, "dgx": 2}) == {"rtx": 1}  # dgx first
    # the 4 rtx of its own guarantee count 4 of the 8 units: 4 more are covered
    assert borrowed(qs, "mixed", {"rtx": 6, "dgx": 2}) == {"rtx": 2}
    assert borrowed(qs, "mixed", {"rtx": 3}) == {}


def test_a_limit_on_top_of_a_guarantee_names_both():
    qs = QueueSet(queues=(Queue("research", guarantee={"rtx": 4}, borrow_limit={"rtx": 2}),))
    jobs = [_job("r0", "research"), _job("r1", "research")]
    result = RoundResult(allocations={"r0": _alloc(6)}, restarted=frozenset(), objective=0.0,
                         timings={}, reasons={"r1": "waiting: no GPUs free for it this round"},
                         rows={"borrow research/rtx": (6.0, 6.0)})
    done = outcome(qs, result, jobs, {}, {"rtx": 16})
    assert done.reasons == {"r1": "waiting: queue research is at its limit of 6 rtx (its "
                                  "guarantee of 4 and a borrowing limit of 2)"}


def test_a_type_flexible_guarantee_is_named_when_met_and_holds_nothing_back_below_it():
    qs = QueueSet(queues=(Queue("nlp", guarantee_units=4), Queue("batch")))
    jobs = [_job("n0", "nlp"), _job("n1", "nlp"), _job("b0", "batch")]
    wait = "waiting: no GPUs free for it this round"

    def reasons(n0_gpus: int) -> dict:
        allocations = {"n0": _alloc(n0_gpus), "b0": _alloc(8 - n0_gpus)}
        result = RoundResult(allocations=allocations, restarted=frozenset(), objective=0.0,
                             timings={}, reasons={"n1": wait},
                             rows={"guarantee nlp/units": (-n0_gpus, -n0_gpus)})
        return outcome(qs, result, jobs, allocations, {"rtx": 8}).reasons

    assert reasons(4) == {"n1": "waiting: queue nlp holds its guarantee of 4 units and the "
                                "cluster has nothing idle to lend"}
    assert reasons(2) == {}  # below it: not a queue rule (its jobs could not use more)


def test_a_job_of_a_queue_below_its_guarantee_gets_a_profiling_slot_at_once():
    """Issue 37, item 6: a queue reclaiming its guarantee got its GPUs a round later
    than documented: in a full cluster its new job waited `profile_wait` (a round)
    for a profiling slot, which only timer rounds gave, and a reclaim cannot begin
    before the job is profiled. A job of a queue below its guarantee waits for no one:
    the next round, early or timer, has its slot; a job of any other queue still
    waits."""
    quota = QueueSet(queues=(Queue("research", guarantee={"rtx": 8}), Queue("batch")))
    h = Harness({"rtx-0": ("rtx", 8), "rtx-1": ("rtx", 8)}, queues=quota)
    _running(h, *[(f"b{k}", "batch") for k in range(4)])
    h.submit("b9", queue="batch", **RIGID4)
    h.tick(seconds=5, trigger="arrival")  # an early round: no slot for a borrower
    assert not any(j.job_id.startswith(PROFILE_SLOT) for j in h.solves[-1].jobs)
    h.submit("r0", queue="research", **RIGID4)
    h.tick(seconds=5, trigger="arrival")
    assert [j.job_id for j in h.solves[-1].jobs if j.job_id.startswith(PROFILE_SLOT)] == [
        PROFILE_SLOT + "rtx"]
