"""Metrics of hand-built runs whose answers are worked out by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_grpc.sim.metrics import (
    Metrics,
    compute,
    format_table,
    from_json,
    rhos,
    summarize,
    to_json,
)
from sia_grpc.sim.records import JobRecord, RoundRecord, SimResult

H = 3600.0


def job(name, submit, finish, *, gpu_h=1.0, restarts=0, iso=None, start=None):
    return JobRecord(name=name, application="resnet", category="adaptive",
                     submit_time=submit, start_time=submit if start is None else start,
                     finish_time=finish, gpu_seconds=gpu_h * H, restarts=restarts,
                     isolated_jct=iso)


def rnd(t, active, policy_s=0.01, used=None, alloc=None):
    return RoundRecord(time=t, policy_seconds=policy_s, active_jobs=active,
                       gpus_in_use=used or {"a100": 0, "t4": 0}, allocations=alloc or {})


def run(jobs, rounds, **kw):
    return SimResult(workload=kw.get("workload", "w1"), policy=kw.get("policy", "sia"),
                     cluster="het", capacity={"a100": 8, "t4": 16}, jobs=tuple(jobs),
                     rounds=tuple(rounds))


def two_jobs() -> SimResult:
    # A: submitted at 0 h, done at 2 h (JCT 2 h); alone it would take 1 h -> rho 2.
    # B: submitted at 1 h, done at 5 h (JCT 4 h); alone it would take 5 h -> rho 0.8.
    jobs = [job("a", 0.0, 2 * H, gpu_h=4.0, restarts=1, iso=1 * H),
            job("b", 1 * H, 5 * H, gpu_h=2.0, restarts=2, iso=5 * H)]
    rounds = [rnd(0.0, 1, 0.010, {"a100": 4, "t4": 0}, {"a": ("a100", 4)}),
              rnd(60.0, 2, 0.020, {"a100": 4, "t4": 2}, {"a": ("a100", 4), "b": ("t4", 2)}),
              rnd(120.0, 2, 0.030),
              rnd(180.0, 1, 0.040)]
    return run(jobs, rounds)


def test_two_jobs_by_hand():
    m = compute(two_jobs())
    assert m.jobs == 2 and m.finished == 2
    assert m.avg_jct_h == pytest.approx(3.0)
    assert m.p99_jct_h == pytest.approx(2.0 + 0.99 * (4.0 - 2.0))  # linear: 3.98
    assert m.makespan_h == pytest.approx(5.0)
    assert m.gpu_hours_per_job == pytest.approx(3.0)
    assert m.restarts_per_job == pytest.approx(1.5)
    assert m.contention_mean == pytest.approx(1.5)
    assert m.contention_max == 2 and isinstance(m.contention_max, int)
    assert m.ftf_worst == pytest.approx(2.0)
    assert m.unfair_fraction == pytest.approx(0.5)
    assert m.policy_ms_median == pytest.approx(25.0)
    assert m.policy_ms_p95 == pytest.approx(30.0 + 0.85 * 10.0)  # rank 0.95 * 3 = 2.85
    assert sorted(rhos(two_jobs())) == pytest.approx([0.8, 2.0])


def test_unfinished_jobs_makespan_runs_to_last_round():
    jobs = [job("a", 0.0, 2 * H, iso=1 * H), job("b", 1 * H, None, iso=2 * H),
            job("c", 1 * H, None, start=None)]
    m = compute(run(jobs, [rnd(0.0, 1), rnd(3 * H, 2)]))
    assert m.jobs == 3 and m.finished == 1
    assert m.avg_jct_h == pytest.approx(2.0) and m.p99_jct_h == pytest.approx(2.0)
    assert m.makespan_h == pytest.approx(3.0)
    assert m.gpu_hours_per_job == pytest.approx(1.0)
    # rho only for the finished job with an isolated JCT
    assert m.ftf_worst == pytest.approx(2.0) and m.unfair_fraction == 1.0


def test_last_finish_after_last_round_still_counts():
    jobs = [job("a", 0.0, 4 * H), job("b", 0.0, None)]
    assert compute(run(jobs, [rnd(0.0, 2), rnd(1 * H, 2)])).makespan_h == pytest.approx(4.0)


def test_nothing_finished_and_no_isolated_jcts():
    jobs = [job("a", 0.0, None, iso=0.0), job("b", 60.0, None)]
    m = compute(run(jobs, [rnd(0.0, 2), rnd(2 * H, 2)]))
    assert m.finished == 0
    assert m.avg_jct_h is None and m.p99_jct_h is None
    assert m.ftf_worst is None and m.unfair_fraction is None
    assert m.makespan_h == pytest.approx(2.0)


def test_empty_run_is_all_none():
    m = compute(run([], []))
    assert m.jobs == 0 and m.finished == 0
    others = {k: v for k, v in m.as_dict().items() if k not in ("jobs", "finished")}
    assert all(v is None for v in others.values()), others
    assert "-" in format_table({"sia": m})
    json.dumps(to_json(run([], []), m), allow_nan=False)


def test_rounds_without_jobs():
    m = compute(run([], [rnd(0.0, 0, 0.002), rnd(60.0, 0, 0.004)]))
    assert m.contention_mean == 0.0 and m.contention_max == 0
    assert m.policy_ms_median == pytest.approx(3.0)
    assert m.makespan_h is None


def metrics(avg, p99=None, ftf=None) -> Metrics:
    return Metrics(jobs=10, finished=10, avg_jct_h=avg, p99_jct_h=p99, makespan_h=avg * 2,
                   gpu_hours_per_job=1.0, restarts_per_job=0.5, contention_mean=2.0,
                   contention_max=3, ftf_worst=ftf, unfair_fraction=None,
                   policy_ms_median=10.0, policy_ms_p95=20.0)


def test_summarize_mean_and_population_std():
    s = summarize([metrics(1.0, 2.0), metrics(2.0, None), metrics(3.0, 4.0)])
    assert s["avg_jct_h"] == pytest.approx((2.0, math.sqrt(2.0 / 3.0)))
    assert s["makespan_h"] == pytest.approx((4.0, 2 * math.sqrt(2.0 / 3.0)))
    assert s["p99_jct_h"] == pytest.approx((3.0, 1.0))  # the None is left out
    assert s["jobs"] == (10.0, 0.0)
    assert "ftf_worst" not in s and "unfair_fraction" not in s  # None everywhere
    assert summarize([]) == {}


def test_table_contains_the_numbers_and_aligns():
    m = compute(two_jobs())
    table = format_table({"sia": m, "gavel": metrics(1.5)}, label="policy")
    lines = table.splitlines()
    assert lines[0].startswith("policy") and "avg JCT h" in lines[0]
    assert lines[2].startswith("sia") and lines[3].startswith("gavel")
    for num in ("3.00", "3.98", "5.00", "1.50", "25.0", "38.5", "2.00", "0.50"):
        assert num in lines[2], num
    assert "-" in lines[3].split()  # gavel's unfair fraction is undefined
    assert len({len(line) for line in lines}) == 1  # aligned

    s = summarize([metrics(1.0), metrics(2.0), metrics(3.0)])
    t2 = format_table({"sia": s})
    assert "2.00 ± 0.82" in t2 and "10.0 ± 0.0" in t2


def test_json_is_plain_and_round_trips():
    r = two_jobs()
    m = compute(r)
    data = to_json(r, m)
    text = json.dumps(data, allow_nan=False)
    back = json.loads(text)
    assert back["metrics"]["avg_jct_h"] == pytest.approx(3.0)
    assert [j["rho"] for j in back["jobs"]] == pytest.approx([2.0, 0.8])
    assert back["rounds"][1]["allocations"]["b"] == ["t4", 2]
    assert from_json(back) == r
    assert compute(from_json(back)) == m
    assert "rounds" not in to_json(r, m, rounds=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e5), st.floats(1.0, 1e5), st.booleans(),
                          st.floats(1.0, 1e5)), max_size=20))
def test_properties(specs):
    jobs = [job(f"j{i}", s, s + d if done else None, iso=iso)
            for i, (s, d, done, iso) in enumerate(specs)]
    m = compute(run(jobs, [rnd(0.0, len(jobs)), rnd(2e5, 0)]))
    for v in m.as_dict().values():
        assert v is None or np.isfinite(v)
    jcts = [j.jct / H for j in jobs if j.jct is not None]
    if jcts:
        assert min(jcts) - 1e-9 <= m.avg_jct_h <= max(jcts) + 1e-9
        assert min(jcts) - 1e-9 <= m.p99_jct_h <= max(jcts) + 1e-9
        assert m.unfair_fraction is not None and 0.0 <= m.unfair_fraction <= 1.0
    if jobs:
        assert m.makespan_h >= max(jcts, default=0.0) - 1e-9
