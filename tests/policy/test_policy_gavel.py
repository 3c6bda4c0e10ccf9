"""Gavel as the Sia artifact runs it: the max-sum-throughput LP over time shares,
priorities from time received, greedy grants and worker packing."""

from __future__ import annotations

import numpy as np
import pytest
from test_policy_sia import job

from sia_grpc.policy import Cluster, GavelPolicy, paper_hetero_cluster
from sia_grpc.policy.baselines import pack_workers, rigid_view
from sia_grpc.policy.candidates import build_candidates
from sia_grpc.policy.cluster import Config, GpuId
from sia_grpc.policy.types import JobAllocation


def rigid(job_id, speed, n, **kw):
    return job(job_id, speed, num_gpus=n, batch_size=64 * n, **kw)


def test_identical_jobs_time_share_one_type_by_time_received():
    cl = Cluster.uniform({"t": (1, 4)})
    jobs = [rigid("a", {"t": 1.0}, 4), rigid("b", {"t": 1.0}, 4)]
    policy, previous = GavelPolicy(), {}
    held = {"a": 0.0, "b": 0.0}
    runs = []
    for _ in range(6):
        jobs = [j.__class__(**{**j.__dict__, "attained": {"t": held[j.job_id]}}) for j in jobs]
        res = policy.optimize(cl, jobs, previous)
        assert len(res.allocations) == 1  # only one fits
        (winner,) = res.allocations
        runs.append(winner)
        held[winner] += policy.round_duration
        previous = dict(res.allocations)
    # The job that has received less time wins the next round: they alternate.
    assert runs in (["a", "b"] * 3, ["b", "a"] * 3)
    assert held["a"] == held["b"]


def test_lp_puts_each_job_on_the_type_that_maximises_total_throughput():
    cl = Cluster.uniform({"fast": (1, 1), "slow": (1, 1)})
    # a gains 4x from the fast GPU, b only 1.5x: the sum is largest with a on fast.
    jobs = [rigid("a", {"fast": 4.0, "slow": 1.0}, 1), rigid("b", {"fast": 1.5, "slow": 1.0}, 1)]
    res = GavelPolicy().optimize(cl, jobs, {})
    assert res.allocations["a"].config.gpu_type == "fast"
    assert res.allocations["b"].config.gpu_type == "slow"
    assert res.objective == pytest.approx((4.0 + 1.0) / 64)  # iterations/s: samples/s / batch


def test_jobs_run_their_own_count_spanning_nodes_not_rounded_up():
    cl = paper_hetero_cluster()  # rtx: 3 nodes of 8
    jobs = [rigid(f"j{k}", {"rtx": 1.0}, 12) for k in range(2)]
    res = GavelPolicy().optimize(cl, jobs, {})
    # Two 12-GPU jobs fit the 24 rtx GPUs (Sia's set would round each up to 16).
    assert sorted(a.config.num_gpus for a in res.allocations.values()) == [12, 12]
    gpus = [g for a in res.allocations.values() for g in a.gpus]
    assert len(gpus) == len(set(gpus)) == 24
    for a in res.allocations.values():
        assert a.num_replicas == 12 and a.config.num_nodes == len({g.node for g in a.gpus})


def test_pack_workers_keeps_previous_gpus_and_fills_the_rest_in_node_order():
    cl = Cluster.uniform({"t": (2, 4)})
    node = [n.name for n in cl.nodes]
    keep = tuple(GpuId(node[1], k) for k in range(2))
    previous = {"old": JobAllocation(config=Config("t", num_nodes=1, num_gpus=2), gpus=keep)}
    placed = pack_workers(cl, {"old": (0, 2), "new": (0, 5)}, previous)
    assert placed["old"][1] == keep
    new_cfg, new_gpus = placed["new"]
    assert len(new_gpus) == 5 and not set(new_gpus) & set(keep)
    assert new_cfg == Config("t", num_nodes=2, num_gpus=5)


def test_attained_time_must_be_non_negative():
    with pytest.raises(ValueError, match="attained"):
        rigid("a", {"t": 1.0}, 1, attained={"t": -1.0})


def test_rigid_counts_round_up_per_type():
    cl = paper_hetero_cluster()
    view = rigid_view(cl, rigid("a", {"aws": 1.0, "rtx": 1.0, "dgx-ext": 1.0}, 12))
    table = build_candidates(cl, [view], {}, scale_rules=False)
    shapes = {(table.config_of(r).gpu_type, table.config_of(r).num_gpus) for r in range(len(table))}
    # aws (4 per node) has 12; rtx and dgx-ext (8 per node) offer 16 and still run 12 replicas.
    assert shapes == {("aws", 12), ("rtx", 16), ("dgx-ext", 16)}
    assert np.all(table.replicas == 12)
