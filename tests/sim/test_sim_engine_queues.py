"""The engine with queues: what the policy is told (queue, priority, stint, the
queues), and what the rounds record (held measured from the applied allocations,
owed from the policy's guarantee rows, the restarts); a real Sia round with queues
once the solver takes side rows."""

from __future__ import annotations

import pytest

from sia_grpc.emulation import load_app
from sia_grpc.policy import make_policy
from sia_grpc.policy.cluster import Config, GpuId, paper_hetero_cluster
from sia_grpc.policy.problem import ChoiceProblem
from sia_grpc.policy.queues import PriorityClass, Queue, QueueSet
from sia_grpc.policy.queues.measures import compute_queues
from sia_grpc.policy.types import JobAllocation, RoundResult
from sia_grpc.sim.engine import simulate
from sia_grpc.sim.records import round_length
from sia_grpc.sim.workload import TraceJob

QUEUES = QueueSet(queues=(Queue("a", guarantee={"rtx": 4}), Queue("b")))


def job(name: str, queue: str = "", priority: str = "", time: float = 0.0) -> TraceJob:
    return TraceJob(name=name, time=time, application="ncf", num_replicas=1,
                    batch_size=load_app("ncf").init_batch_size, queue=queue, priority=priority)


class Claims:
    """Gives each job one rtx GPU of its own for `rounds` rounds (then none, so a
    job's GPUs change once), and claims, falsely, that queue a holds 99; its
    guarantee row says a is owed 3 rtx."""

    name = "claims"
    round_duration = 60.0

    def __init__(self, rounds: int = 3) -> None:
        self.seen: list[list[tuple[str, str, str, float]]] = []
        self.given: list[object] = []
        self.rounds = rounds

    def optimize(self, cluster, jobs, previous, *, queues=None) -> RoundResult:
        self.seen.append([(j.job_id, j.queue, j.priority, j.stint) for j in jobs])
        self.given.append(queues)
        allocs = {}
        if len(self.seen) <= self.rounds:
            for i, j in enumerate(jobs):
                allocs[j.job_id] = JobAllocation(
                    config=Config("rtx", 1, 1), gpus=(GpuId("rtx-0", i),), num_replicas=1,
                    batch_size=256, atomic_bsz=256, accum_steps=0)
        return RoundResult(allocations=allocs, restarted=frozenset(), objective=0.0,
                           timings={}, queues={"a": {"rtx": 99}},
                           rows={"guarantee a/rtx": (-1.0, -3.0), "borrow a/rtx": (1.0, 9.0),
                                 "restarts": (0.0, 2.0)})


def test_the_policy_is_told_queues_priorities_and_stints():
    policy = Claims()
    simulate([job("j0", "a", "prod"), job("j1")], paper_hetero_cluster(1), policy,
             queues=QueueSet(queues=QUEUES.queues, priority_classes=(PriorityClass("prod"),)),
             config=_short())
    assert all(q is not None for q in policy.given)
    first, second, third, fourth, fifth = policy.seen[:5]
    # j1 names no queue nor class: `default` both; stints count seconds on the allocation.
    assert first == [("j0", "a", "prod", 0.0), ("j1", "default", "default", 0.0)]
    assert second == [("j0", "a", "prod", 60.0), ("j1", "default", "default", 60.0)]
    assert third[0][3] == 120.0 and fourth[0][3] == 180.0
    assert fifth[0][3] == 0.0  # preempted in the fourth round: no allocation, no stint


def test_held_is_measured_and_owed_is_read_from_the_rows():
    result = simulate([job("j0", "a"), job("j1", "b")], paper_hetero_cluster(1), Claims(),
                      queues=QUEUES, config=_short())
    first = result.rounds[0]
    # The policy claimed 99; the simulator counts the one GPU it applied.
    assert first.held["a"] == {"aws": 0, "dgx-ext": 0, "rtx": 1}
    assert first.held["b"]["rtx"] == 1 and first.held["default"]["rtx"] == 0
    assert first.owed == {"a": {"rtx": 3.0}, "b": {}, "default": {}}
    assert first.restore_s == load_app("ncf").restart_delay
    # Round 4 takes both jobs' GPUs: a checkpoint-restart cycle each.
    assert [r.restarted for r in result.rounds[:4]] == [(), (), (), ("j0", "j1")]
    assert result.queues["a"].guarantee == {"rtx": 4} and result.round_seconds == 60.0
    assert {j.name: j.queue for j in result.jobs} == {"j0": "a", "j1": "b"}
    m = compute_queues(result, round_length(result))["a"]
    assert m.shortfall_gpu_h > 0  # held 1 of the 3 owed, whatever the policy claimed


def test_an_unknown_queue_or_class_is_refused():
    with pytest.raises(ValueError, match="unknown queue 'zz'"):
        simulate([job("j0", "zz")], paper_hetero_cluster(1), Claims(), queues=QUEUES)
    with pytest.raises(ValueError, match="unknown priority class 'vip'"):
        simulate([job("j0", "a", "vip")], paper_hetero_cluster(1), Claims(), queues=QUEUES)


def test_without_queues_the_policy_is_called_as_before():
    class Plain(Claims):
        def optimize(self, cluster, jobs, previous):  # no queues keyword at all
            return super().optimize(cluster, jobs, previous)

    result = simulate([job("j0")], paper_hetero_cluster(1), Plain(), config=_short())
    assert result.rounds[0].held == {} and result.rounds[0].owed is None
    assert result.queues == {} and compute_queues(result, round_length(result)) == {}


def _short():
    from sia_grpc.sim.engine import SimConfig

    return SimConfig(max_hours=0.2)


needs_side_rows = pytest.mark.skipif(
    "row_ptr" not in getattr(ChoiceProblem, "__dataclass_fields__", {}),
    reason="the solver does not take side rows yet")


@needs_side_rows
def test_sia_with_queues_gives_a_queue_its_guarantee():
    """Real Sia rounds: queue b floods the cluster first; queue a's jobs arrive
    later and get their guarantee back (no violation beyond the grace)."""
    queues = QueueSet(queues=(Queue("a", guarantee={"rtx": 4}), Queue("b")))
    jobs = [job(f"b{i}", "b") for i in range(6)] + [job(f"a{i}", "a", time=1800.0)
                                                   for i in range(4)]
    result = simulate(jobs, paper_hetero_cluster(1), make_policy("sia"), queues=queues)
    m = compute_queues(result, round_length(result))
    assert m["a"].guarantee_violation_gpu_h == 0.0
    after = [r for r in result.rounds if r.time >= 1800.0 and (r.owed or {}).get("a")]
    assert after and all(r.held["a"]["rtx"] >= r.owed["a"]["rtx"] for r in after[3:])
