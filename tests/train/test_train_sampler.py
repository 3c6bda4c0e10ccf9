"""The elastic sampler: whatever the sequence of shapes, every sample of every
epoch is trained on exactly once, and every rank gets a non-empty share."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as s

from sia_grpc.train.env import WorkerEnv
from sia_grpc.train.sampler import (
    Position,
    StepShape,
    epoch_order,
    micro_slice,
    plan_step,
    shape_for,
    step_indices,
)

shapes = s.builds(StepShape, replicas=s.integers(1, 6), atomic=s.integers(1, 9),
                  accum=s.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(n=s.integers(6, 150), seed=s.integers(0, 5), schedule=s.lists(
    s.tuples(shapes, s.integers(1, 6)), min_size=1, max_size=8))
def test_any_shape_sequence_trains_each_sample_once_per_epoch(n, seed, schedule):
    seen: dict[int, list[int]] = {}
    at, epochs = Position(), 3
    steps = [sh for sh, count in schedule for _ in range(count)]
    i = 0
    while at.epoch < epochs:
        shape = steps[min(i, len(steps) - 1)]
        i += 1
        plan = plan_step(at, n, shape)
        if plan is None:  # the epoch is done; a remainder below R is carried over
            at = Position(at.epoch + 1, 0, n - at.pos)
            continue
        idx = step_indices(plan, n, seed)
        assert len(idx) == plan.n and 1 <= plan.k <= shape.accum + 1
        covered = []
        for a in range(plan.k):
            for r in range(shape.replicas):
                lo, hi = micro_slice(plan, a, r)
                assert hi > lo  # nobody idles
                covered.extend(range(lo, hi))
        assert covered == list(range(plan.n))  # disjoint, complete
        epoch_of = [at.epoch - 1] * min(at.carry, plan.n) + [at.epoch] * (plan.n - at.carry)
        for e, j in zip(epoch_of, idx.tolist(), strict=False):
            seen.setdefault(e, []).append(j)
        at = plan.end()
    for e in range(epochs - 1):  # the last epoch may carry its tail into the next
        assert sorted(seen[e]) == list(range(n)), e


def test_orders_are_fixed_by_seed_and_epoch():
    a = epoch_order(100, 7, 3)
    assert (a == epoch_order(100, 7, 3)).all()
    assert not (a == epoch_order(100, 7, 4)).all()
    assert sorted(a.tolist()) == list(range(100))


def test_shape_from_the_agents_batch():
    assert shape_for(4, atomic=8, accum=1).batch_size == 64
    assert shape_for(3, batch_size=64) == StepShape(3, 21, 0)
    assert shape_for(2, batch_size=1) == StepShape(2, 1, 0)


def test_small_leftover_is_folded_into_the_last_step():
    plan = plan_step(Position(0, 90), 100, StepShape(4, 2, 0))  # 10 left, batch 8
    assert plan.n == 10 and plan.k == 1 and not plan.regular


def test_env_parsing():
    env = WorkerEnv.from_environ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                                  "SIA_PROFILE": "8, 16", "SIA_PACE": "2.5",
                                  "SIA_TARGET_EPOCHS": "1.5"})
    assert env.distributed and env.num_nodes == 2 and env.profile_sizes == (8, 16)
    assert env.pace == 2.5 and env.target_epochs == 1.5
    alone = WorkerEnv.from_environ({})
    assert not alone.distributed and alone.world_size == 1 and not alone.profiling
