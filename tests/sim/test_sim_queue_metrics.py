"""Per-queue metrics of hand-made records, worked out by hand: the guarantee
violation and its grace, the shortfall, the reclaim, and the JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_grpc.policy.queues.measures import Episode, compute_queues, episodes
from sia_grpc.sim.metrics import compute, from_json, to_json
from sia_grpc.sim.records import JobRecord, QueueSpec, RoundRecord, SimResult, round_length

H = 3600.0
L = 60.0


def rounds(held_a, *, owed=4.0, times=None, restore=90.0, key="rtx", alloc=None,
           restarted=None):
    """Rounds of queue `a` (guarantee 4 rtx) owed `owed` and holding held_a[r] rtx."""
    times = times or [r * L for r in range(len(held_a))]
    restore = restore if isinstance(restore, list) else [restore] * len(held_a)
    return [RoundRecord(time=t, policy_seconds=0.0, active_jobs=1, gpus_in_use={},
                        allocations=(alloc or {}).get(r, {}),
                        restarted=(restarted or {}).get(r, ()),
                        held={"a": {"rtx": h}, "b": {"rtx": 0}},
                        owed={"a": {key: owed}, "b": {}}, restore_s=c)
            for r, (t, h, c) in enumerate(zip(times, held_a, restore, strict=True))]


def result(recs, *, min_runtime=0.0, jobs=(), unit_weights=None, units=0.0):
    return SimResult(workload="w", policy="sia", cluster="c", capacity={"rtx": 8, "aws": 8},
                     jobs=tuple(jobs), rounds=tuple(recs), round_seconds=L,
                     queues={"a": QueueSpec({"rtx": 4}, units), "b": QueueSpec()},
                     unit_weights=unit_weights or {}, min_runtime_s=min_runtime)


def metrics_a(recs, **kw):
    run = result(recs, **kw)
    return compute_queues(run, round_length(run))["a"]


def test_short_within_the_grace_is_no_violation():
    # Owed 4 from t=0, given at the third round (t=120); grace = 60 + 90 s = 150 s.
    m = metrics_a(rounds([0, 0, 4, 4]))
    assert m.guarantee_violation_gpu_h == 0.0
    assert m.shortfall_gpu_h == pytest.approx(4 * 120 / H)
    assert m.reclaim_s == 120.0


def test_short_beyond_the_grace_counts_from_the_grace_on():
    # Short for 4 rounds: [120, 180) is past the grace from t = 150 for 30 s, then
    # all of [180, 240): 4 GPUs × 90 s.
    m = metrics_a(rounds([0, 0, 0, 0]))
    assert m.guarantee_violation_gpu_h == pytest.approx(4 * 90 / H)
    assert m.shortfall_gpu_h == pytest.approx(4 * 240 / H)
    assert m.reclaim_s == 240.0  # never given: to the run's end


def test_the_grace_takes_the_longest_restore_of_the_streak():
    # 30 s restores give 90 s of grace: [90, 120) and all of [120, 240) count.
    m = metrics_a(rounds([0, 0, 0, 0], restore=30.0))
    assert m.guarantee_violation_gpu_h == pytest.approx(4 * 150 / H)
    # A job with a 200 s restore active from the second round on: grace 260 s.
    m = metrics_a(rounds([0, 0, 0, 0], restore=[30.0, 200.0, 30.0, 30.0]))
    assert m.guarantee_violation_gpu_h == 0.0
    # The grace only learns of it in the round it is there: [90, 120) was past it.
    m = metrics_a(rounds([0, 0, 0, 0], restore=[30.0, 30.0, 200.0, 30.0]))
    assert m.guarantee_violation_gpu_h == pytest.approx(4 * 30 / H)


def test_the_minimum_runtime_extends_the_grace():
    assert metrics_a(rounds([0, 0, 0, 0]), min_runtime=120.0).guarantee_violation_gpu_h == 0
    assert metrics_a(rounds([0, 0, 0, 0]), min_runtime=30.0).guarantee_violation_gpu_h \
        == pytest.approx(4 * 60 / H)  # grace 180 s: [180, 240)


def test_a_round_given_in_full_ends_the_streak():
    # Short, given, short again: two streaks, each within its own grace.
    m = metrics_a(rounds([0, 0, 4, 0, 0, 4]))
    assert m.guarantee_violation_gpu_h == 0.0
    assert m.shortfall_gpu_h == pytest.approx(4 * 240 / H)


def test_an_idle_gap_ends_the_streak():
    m = metrics_a(rounds([0, 0, 0, 0], times=[0.0, 60.0, 600.0, 660.0]))
    assert m.guarantee_violation_gpu_h == 0.0


def test_partial_shortfall_counts_only_the_gpus_missing():
    m = metrics_a(rounds([3] * 5))  # one GPU short from t = 0: counted from 150 to 300
    assert m.guarantee_violation_gpu_h == pytest.approx(1 * 150 / H)


def test_holding_more_than_owed_is_no_shortfall():
    m = metrics_a(rounds([8, 8, 8]))
    assert m.guarantee_violation_gpu_h == m.shortfall_gpu_h == 0.0 and m.reclaim_s == 0.0


def test_the_violation_while_a_job_of_the_queue_waits():
    # Violation 4 GPUs over [150, 240) (as above). a1 runs from the start; a2, of
    # queue a too, waits (no allocation) from t = 60 until it runs at t = 180, and b's
    # job waiting counts for nothing: only [150, 180) is a violation while waiting.
    alloc = {r: {"a1": ("rtx", 1), **({"a2": ("rtx", 1)} if r == 3 else {})}
             for r in range(4)}
    jobs = [JobRecord("a1", "ncf", "adaptive", 0.0, 0.0, None, 0.0, 0, queue="a"),
            JobRecord("a2", "ncf", "adaptive", 60.0, 180.0, None, 0.0, 0, queue="a"),
            JobRecord("b1", "ncf", "adaptive", 0.0, None, None, 0.0, 0, queue="b")]
    m = metrics_a(rounds([0, 0, 0, 0], alloc=alloc), jobs=jobs)
    assert m.guarantee_violation_gpu_h == pytest.approx(4 * 90 / H)
    assert m.violation_waiting_gpu_h == pytest.approx(4 * 30 / H)
    # A job that finished is not waiting; without jobs of a waiting, nothing counts.
    done = [dataclasses.replace(jobs[1], finish_time=60.0)]
    assert metrics_a(rounds([0, 0, 0, 0], alloc=alloc), jobs=done).violation_waiting_gpu_h \
        == 0.0


def test_units_weigh_each_type():
    # 6 units owed; 2 rtx at 2 units each + 1 aws at 1 unit = 5: one unit short.
    recs = [RoundRecord(time=r * L, policy_seconds=0.0, active_jobs=1, gpus_in_use={},
                        held={"a": {"rtx": 2, "aws": 1}}, owed={"a": {"units": 6.0}},
                        restore_s=0.0)
            for r in range(4)]
    m = metrics_a(recs, unit_weights={"rtx": 2.0}, units=6.0)
    assert m.shortfall_gpu_h == pytest.approx(4 * L / H)
    assert m.guarantee_violation_gpu_h == pytest.approx(3 * L / H)  # grace 60 s


def test_reclaim_counts_the_jobs_that_gave_way():
    # Queue a claims 4 rtx at t=0 and gets them at t=120. In round 1 b's job y only
    # moves (same GPUs) and a's own job a1 shrinks; in round 2 b's job x is
    # preempted: x alone gave way.
    alloc = {0: {"x": ("rtx", 4), "y": ("rtx", 2), "a1": ("rtx", 2)},
             1: {"x": ("rtx", 4), "y": ("rtx", 2), "a1": ("rtx", 1)},
             2: {"y": ("rtx", 2), "a1": ("rtx", 4)}}
    restarted = {1: ("y", "a1"), 2: ("x", "a1")}
    jobs = [JobRecord(n, "ncf", "adaptive", 0.0, 0.0, None, 0.0, 0, queue=q)
            for n, q in (("x", "b"), ("y", "b"), ("a1", "a"))]
    run = result(rounds([0, 0, 4], alloc=alloc, restarted=restarted), jobs=jobs)
    length = round_length(run)
    m = compute_queues(run, length)["a"]
    assert (m.reclaim_s, m.reclaim_restarts) == (120.0, 1)
    assert episodes(run, "a", length) == [Episode("rtx", 0.0, 120.0, ((120.0, "x"),))]


def test_episodes_end_when_given_and_start_again_on_a_new_claim():
    run = result(rounds([0, 4, 4, 2, 2], owed=4.0))  # 4 owed; given at 60; 2 taken at 180
    length = round_length(run)
    assert [(e.start_s, e.end_s) for e in episodes(run, "a", length)] == [(0.0, 60.0),
                                                                          (180.0, None)]
    assert compute_queues(run, length)["a"].reclaim_s == 300.0 - 180.0  # to the run's end


def test_jobs_jct_and_gpu_hours_per_queue():
    jobs = [JobRecord("a0", "ncf", "adaptive", 0.0, 0.0, 2 * H, 3 * H, 0, queue="a"),
            JobRecord("a1", "ncf", "adaptive", H, H, 5 * H, 1 * H, 0, queue="a"),
            JobRecord("b0", "ncf", "adaptive", 0.0, None, None, 0.0, 0, queue="b")]
    run = result(rounds([4]), jobs=jobs)
    out = compute_queues(run, round_length(run))
    a, b = out["a"], out["b"]
    assert (a.jobs, a.finished, a.avg_jct_h, a.gpu_hours) == (2, 2, 3.0, 4.0)
    assert a.p99_jct_h == pytest.approx(2 + 0.99 * 2)
    assert (b.jobs, b.finished, b.avg_jct_h, b.p99_jct_h) == (1, 0, None, None)
    assert b.guarantee_violation_gpu_h == 0.0  # never owed anything


def test_a_policy_that_reports_no_rows_has_no_violation_figure():
    recs = [RoundRecord(time=0.0, policy_seconds=0.0, active_jobs=1, gpus_in_use={},
                        held={"a": {"rtx": 0}}, owed=None)]
    m = metrics_a(recs)
    assert m.guarantee_violation_gpu_h is None and m.shortfall_gpu_h is None
    assert m.reclaim_s is None and m.reclaim_restarts is None


def test_a_run_without_queues_has_none():
    assert compute_queues(SimResult("w", "sia", "c", {}, (), ()), None) == {}
    data = to_json(SimResult("w", "sia", "c", {}, (), ()), compute(SimResult(
        "w", "sia", "c", {}, (), ())))
    assert "queues" not in data["metrics"] and "queues" not in data


def test_json_has_metrics_queues_and_round_trips():
    jobs = [JobRecord("a0", "ncf", "adaptive", 0.0, 0.0, 2 * H, 3 * H, 0, queue="a",
                      priority="prod")]
    run = result(rounds([0, 0, 0, 0], restarted={1: ("a0",)}), jobs=jobs, min_runtime=30.0)
    data = json.loads(json.dumps(to_json(run, compute(run))))
    q = data["metrics"]["queues"]["a"]
    assert set(q) >= {"jobs", "avg_jct_h", "p99_jct_h", "gpu_hours",
                      "guarantee_violation_gpu_h"}
    assert q["guarantee_violation_gpu_h"] == pytest.approx(4 * 60 / H)
    back = from_json(data)
    assert back == run
    assert (compute_queues(back, round_length(back))
            == compute_queues(run, round_length(run)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=30),
       st.floats(0, 300))
def test_violation_is_within_the_shortfall_and_grows_with_less_grace(pairs, restore):
    """0 ≤ violation ≤ shortfall; a longer restore (more grace) never adds violation."""
    def one(c):
        recs = [RoundRecord(time=r * L, policy_seconds=0.0, active_jobs=1, gpus_in_use={},
                            held={"a": {"rtx": h}}, owed={"a": {"rtx": float(o)}},
                            restore_s=c)
                for r, (h, o) in enumerate(pairs)]
        return metrics_a(recs)

    m, more = one(restore), one(restore + 100.0)
    assert 0.0 <= m.guarantee_violation_gpu_h <= m.shortfall_gpu_h + 1e-12
    assert more.guarantee_violation_gpu_h <= m.guarantee_violation_gpu_h + 1e-12
    assert m.shortfall_gpu_h == pytest.approx(
        sum(max(o - h, 0) for h, o in pairs) * L / H)
