"""sia-plus's levers on hand-derived cases: the restart payback, the remaining-work
weights and larger starts; with every lever off it is Sia."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_policy_sia import job

from sia_grpc.policy import Cluster, Config, SettingError, SiaPolicy, make_policy
from sia_grpc.policy.candidates import build_candidates, current_index
from sia_grpc.policy.sia_plus import (
    SiaPlusPolicy,
    give_way_factors,
    remaining_runs,
    restart_pays,
)
from sia_grpc.policy.types import JobAllocation

TWO = Cluster.uniform({"fast": (1, 1), "slow": (1, 1)})
ON_SLOW = {"a": JobAllocation(Config("slow", 1, 1), gpus=(), goodput=1.0)}


def on_slow(progress: float, **kw):
    """A job an hour into its run on the slow GPU, 20% faster on the fast one, old
    enough that Sia's restart factor lets it move (r = 0.97)."""
    return job("a", {"fast": 1.2, "slow": 1.0}, age=100 * 3600.0, restart_cost=100.0,
               progress=progress, attained={"slow": 3600.0}, **kw)


def gpu_type(policy, j) -> str:
    return policy.optimize(TWO, [j], ON_SLOW).allocations["a"].config.gpu_type


def test_a_job_near_its_end_is_not_moved_for_a_small_gain():
    # Remaining run R = 3600 · (1 − 0.99) / 0.99 = 36.4 s; the move saves
    # R · (1 − 1/1.2) = 6.1 s, less than its 100 s restart: it stays.
    near_end = on_slow(0.99)
    assert gpu_type(SiaPolicy(), near_end) == "fast"  # Sia moves it (age-based factor)
    assert gpu_type(SiaPlusPolicy(), near_end) == "slow"


def test_a_job_far_from_its_end_still_moves():
    # R = 3600 · 0.9 / 0.1 = 32,400 s; the move saves 5,400 s against a 100 s restart.
    far = on_slow(0.1)
    assert gpu_type(SiaPlusPolicy(), far) == "fast"
    # The gate scales with `payback`: 5,400 s is 54 restarts' worth, not 60.
    assert gpu_type(make_policy("sia-plus", {"payback": 53}), far) == "fast"
    assert gpu_type(make_policy("sia-plus", {"payback": 55}), far) == "slow"


def test_a_total_run_time_stands_for_the_time_per_type():
    """A caller that knows only the total time held (PolicyService's run_time_s)
    gets the same gate; the total wins over `attained`, which Gavel keeps per type."""
    for progress, where in ((0.99, "slow"), (0.1, "fast")):
        total = dataclasses.replace(on_slow(progress), attained={}, total_run_time=3600.0)
        assert total.remaining_run_time() == on_slow(progress).remaining_run_time()
        assert gpu_type(SiaPlusPolicy(), total) == where
    both = dataclasses.replace(on_slow(0.5), total_run_time=60.0)
    assert (both.run_time, both.remaining_run_time()) == (60.0, 60.0)
    with pytest.raises(ValueError, match="^total_run_time: must be non-negative"):
        dataclasses.replace(on_slow(0.5), total_run_time=-1.0)


def test_a_job_settles_for_min_stint_restart_costs_before_it_moves():
    # S = 100 s, min_stint = 2: a job 150 s into its allocation stays; at 250 s it moves.
    settle = make_policy("sia-plus", {"min_stint": 2})
    assert gpu_type(settle, on_slow(0.1, stint=150.0)) == "slow"
    assert gpu_type(settle, on_slow(0.1, stint=250.0)) == "fast"
    assert gpu_type(SiaPlusPolicy(), on_slow(0.1, stint=150.0)) == "fast"  # (off: moves)


def test_restart_pays_row_by_row():
    # One running job on 1 slow GPU, goodput 1 there; its rows: fast 1 (1.2, a move),
    # slow 1 (stay), slow 2 (1.8, a resize). R = 900 s, S = 100 s.
    cl = Cluster.uniform({"fast": (1, 1), "slow": (1, 2)})
    j = job("a", {"fast": 1.2, "slow": 1.0}, exponent=np.log2(1.8), restart_cost=100.0,
            progress=0.8, attained={"slow": 3600.0})  # R = 3600 · 0.2 / 0.8 = 900 s
    prev = {"a": JobAllocation(Config("slow", 1, 1), gpus=())}
    table = build_candidates(cl, [j], prev)
    cur = current_index(cl, [j], prev)
    rows = [(table.config_of(r).gpu_type, table.config_of(r).num_gpus) for r in range(len(table))]
    assert rows == [("fast", 1), ("slow", 1), ("slow", 2)]
    # Saved: fast 900 · (1 − 1/1.2) = 150 s; slow 2: 900 · (1 − 1/1.8) = 400 s.
    assert list(restart_pays(table, [j], cur, 1.0)) == [True, True, True]
    assert list(restart_pays(table, [j], cur, 2.0)) == [False, True, True]
    assert list(restart_pays(table, [j], cur, 4.0)) == [False, True, False]
    # A shrink or a move to a slower shape is for the others' sake: never gated.
    on_two = {"a": JobAllocation(Config("slow", 1, 2), gpus=())}
    assert list(restart_pays(table, [j], current_index(cl, [j], on_two), 100.0)) == \
        [True, True, True]
    # No progress reported yet: nothing known, every row stays an option.
    fresh = dataclasses.replace(j, progress=0.0)
    assert list(restart_pays(table, [fresh], cur, 100.0)) == [True, True, True]


def test_give_way_factors_row_by_row():
    # The job of test_restart_pays_row_by_row on 2 slow GPUs (goodput 1.8 there); its
    # rows fast 1 (1.2) and slow 1 (1.0) are slower: it would give way. It alone
    # reports a remaining run, R = 900 s = H; S = 100 s.
    cl = Cluster.uniform({"fast": (1, 1), "slow": (1, 2)})
    j = job("a", {"fast": 1.2, "slow": 1.0}, exponent=np.log2(1.8), restart_cost=100.0,
            progress=0.8, attained={"slow": 3600.0})
    on_two = {"a": JobAllocation(Config("slow", 1, 2), gpus=())}
    table = build_candidates(cl, [j], on_two)
    cur = current_index(cl, [j], on_two)
    assert give_way_factors(table, [j], cur, 1.0) == pytest.approx([900 / 1000, 900 / 1000, 1])
    assert give_way_factors(table, [j], cur, 2.0) == pytest.approx([900 / 1100, 900 / 1100, 1])
    # On 1 slow GPU its other rows are faster (the payback gate's business): no charge.
    on_one = {"a": JobAllocation(Config("slow", 1, 1), gpus=())}
    assert list(give_way_factors(table, [j], current_index(cl, [j], on_one), 2.0)) == [1, 1, 1]
    # H is the median of the jobs that report a remaining run: 900 and 60 s -> 480 s.
    short = job("b", {"fast": 1.0, "slow": 1.0}, progress=0.5, attained={"slow": 60.0})
    table = build_candidates(cl, [j, short], on_two)
    cur = current_index(cl, [j, short], on_two)
    assert give_way_factors(table, [j, short], cur, 1.0)[:3] == \
        pytest.approx([480 / 580, 480 / 580, 1])


def test_a_long_job_does_not_give_way_to_jobs_done_before_its_restore_pays():
    # a: hours of running left on both fast GPUs (S = 250 s); c and d: a minute left
    # each on a slow GPU; b arrives (1 GPU at most). Normalised goodput (by the slow
    # GPU's 0.25): a on fast 2 is 8, on fast 1 is 4; b on fast 1 is 4, on slow 1 is 1.
    # Sia-plus shrinks a for b: −4^−½ + 8^−½ = −0.15 for a, −4^−½ + 1 = +0.5 for b.
    # With give_way 1, H = median(32,400, 60, 60) = 60 s and a's shrink keeps
    # 60 / (60 + 250) = 0.19 of its goodput: −(4·0.19)^−½ + 8^−½ = −0.78 < 0.5.
    cl = Cluster.uniform({"fast": (1, 2), "slow": (1, 3)})
    speed = {"fast": 1.0, "slow": 0.25}
    a = job("a", speed, age=100 * 3600.0, restart_cost=250.0, progress=0.1,
            attained={"fast": 3600.0})  # R = 32,400 s
    short = [job(n, speed, restart_cost=100.0, progress=0.5, attained={"slow": 60.0})
             for n in ("c", "d")]  # R = 60 s
    b = job("b", speed, age=0.0, max_gpus=1)
    prev = {"a": JobAllocation(Config("fast", 1, 2), gpus=()),
            **{j.job_id: JobAllocation(Config("slow", 1, 1), gpus=()) for j in short}}

    def shape(policy):
        got = policy.optimize(cl, [a, b, *short], prev).allocations
        return {n: (got[n].config.gpu_type, got[n].config.num_gpus) for n in ("a", "b")}

    assert shape(SiaPlusPolicy()) == {"a": ("fast", 1), "b": ("fast", 1)}
    assert shape(make_policy("sia-plus", {"give_way": 1})) == {"a": ("fast", 2),
                                                               "b": ("slow", 1)}


def test_remaining_run_net_of_restores_by_hand():
    # Half done in 600 s of running, 2 restarts after its start, S = 100 s: gross
    # R = 600 s; net of the three restores, 300 s of running made the half: R = 300 s.
    j = job("a", {"fast": 1.0}, num_restarts=2, restart_cost=100.0, progress=0.5,
            attained={"fast": 600.0})
    assert list(remaining_runs([j])) == [600.0]
    assert list(remaining_runs([j], net=True)) == [300.0]
    # A job whose restores take up its whole run time so far: unknown when net.
    first = job("b", {"fast": 1.0}, restart_cost=100.0, progress=0.01, attained={"fast": 60.0})
    assert np.isnan(remaining_runs([first], net=True)[0])
    assert remaining_runs([first])[0] == pytest.approx(60 * 99)


def test_remaining_work_weights_by_hand():
    policy = make_policy("sia-plus", {"srpt": 0.5})
    jobs = [job("short", {"fast": 1.0}, progress=0.5, attained={"fast": 30.0}),  # R 30 s → 60
            job("long", {"fast": 1.0}, progress=0.5, attained={"fast": 3600.0}),  # R 3600 s
            job("new", {"fast": 1.0})]  # no estimate: the median, 1830 s
    expected = np.array([60.0, 3600.0, 1830.0]) ** -0.5
    assert policy.job_weights(jobs) == pytest.approx(expected / expected.max())
    assert list(SiaPlusPolicy().job_weights(jobs)) == [1.0, 1.0, 1.0]  # srpt = 0: off


def test_the_job_nearer_its_end_gets_the_one_gpu():
    one = Cluster.uniform({"fast": (1, 1)})
    jobs = [job("long", {"fast": 1.0}, progress=0.5, attained={"fast": 7200.0}),
            job("short", {"fast": 1.0}, progress=0.5, attained={"fast": 600.0})]
    for order in (jobs, jobs[::-1]):
        got = make_policy("sia-plus", {"srpt": 0.5}).optimize(one, order, {}).allocations
        assert set(got) == {"short"}


def test_a_new_job_starts_on_up_to_start_scale_times_its_minimum():
    cl = Cluster.uniform({"fast": (1, 8)})
    new = job("a", {"fast": 1.0}, exponent=0.9)
    assert SiaPolicy().optimize(cl, [new], {}).allocations["a"].config.num_gpus == 1
    got = make_policy("sia-plus", {"start_scale": 4}).optimize(cl, [new], {}).allocations
    assert got["a"].config.num_gpus == 4


def test_with_every_lever_off_it_is_sia():
    cl = Cluster.uniform({"fast": (1, 4), "slow": (2, 4)})
    jobs = [job(f"j{k}", {"fast": 1.0 + k / 10, "slow": 0.5}, exponent=0.8, progress=0.3,
                attained={"fast": 600.0 * (k + 1)}, age=3600.0 * (k + 1)) for k in range(5)]
    off = make_policy("sia-plus", {"payback": 0, "srpt": 0, "start_scale": 1,
                                   "max_scale_up": 2, "give_way": 0})
    prev_sia, prev_off = {}, {}
    for _ in range(3):
        a = SiaPolicy().optimize(cl, jobs, prev_sia)
        b = off.optimize(cl, jobs, prev_off)
        assert a.allocations == b.allocations and a.objective == b.objective
        prev_sia, prev_off = dict(a.allocations), dict(b.allocations)


@pytest.mark.parametrize("key, value", [("payback", -1), ("srpt", -0.5), ("start_scale", 0.5),
                                        ("srpt_cap_h", 0), ("min_stint", -1),
                                        ("give_way", -1)])
def test_bad_settings_name_the_key(key, value):
    with pytest.raises(SettingError, match=f"^sia-plus.{key}: "):
        make_policy("sia-plus", {key: value})


def test_named_wherever_a_policy_is_named():
    """The controller's `[policy.sia-plus]` table and PolicySpec (its solver process),
    `sia simulate --set sia-plus.*` and OptimizeRequest all go through these."""
    from sia_grpc.policy import params

    table = params.from_toml({"sia-plus": {"start_scale": 4, "srpt": "0.25"}})
    spec = params.PolicySpec("sia-plus", tuple(sorted(table["sia-plus"].items())), 60.0)
    policy = spec.build()
    assert (policy.name, policy.config.start_scale, policy.config.srpt) == ("sia-plus", 4.0, 0.25)
    assert params.assignment("sia-plus.payback=2") == ("sia-plus", "payback", "2")
