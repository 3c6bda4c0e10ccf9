"""The simulator's ground truth: measured step times, interpolation, progress."""

import math

import numpy as np
import pytest

from sia_grpc.emulation import SUPPORTED_APPLICATIONS, AppTruth, load_app
from sia_grpc.models.efficiency import GradParams, gain
from sia_grpc.models.profiles import (
    APPLICATIONS,
    StepTimes,
    load_placements,
    load_seed_profiles,
    load_validation,
)
from sia_grpc.policy import paper_hetero_cluster, paper_homo_cluster

APPS = tuple(a for a in APPLICATIONS if a != "gpt_pmp")
PAPER_TYPES = ("aws", "dgx-ext", "rtx")


def _rows(app: str, gpu_type: str, placement: str) -> dict[int, tuple[float, float]]:
    p = load_placements(app, gpu_type)
    out: dict[int, tuple[float, float]] = {}
    for pl, b, s, y in zip(p.placement, p.local_bsz, p.step_time, p.sync_time, strict=True):
        if pl == placement:
            assert int(b) not in out, "test expects one row per batch size"
            out[int(b)] = (float(s), float(y))
    assert out
    return out


def _bsz_grid(app: AppTruth, gpu_type: str, n: int = 12) -> list[int]:
    lo, hi = app.local_bsz_limits(gpu_type)
    return sorted({int(round(b)) for b in np.geomspace(lo, hi, n)})


def test_supported_applications():
    assert set(SUPPORTED_APPLICATIONS) == set(APPS)
    with pytest.raises(ValueError, match="gpt_pmp"):
        load_app("gpt_pmp")
    with pytest.raises(ValueError, match="application: unknown 'resnet'"):
        load_app("resnet")
    assert load_app("cifar10") is load_app("cifar10")  # cached


@pytest.mark.parametrize("name", APPS)
def test_application_facts(name):
    app = load_app(name)
    spec = APPLICATIONS[name]
    assert (app.num_epochs, app.restart_delay, app.slowdown) == (
        spec.num_epochs, spec.restart_delay, spec.slowdown)
    assert set(PAPER_TYPES) <= set(app.gpu_types)
    assert app.init_batch_size < app.max_batch_size
    for t in app.gpu_types:
        bsz = load_placements(name, t).local_bsz
        assert app.local_bsz_limits(t) == (int(bsz.min()), int(bsz.max()))
    assert app.gpus_per_node("aws") == 4
    assert app.gpus_per_node("rtx") == app.gpus_per_node("dgx-ext") == 8


def test_cifar10_facts():
    app = load_app("cifar10")
    assert (app.init_batch_size, app.max_batch_size) == (128, 4096)
    assert app.slowdown == 1.8


@pytest.mark.parametrize(("gpu_type", "placement", "nodes", "replicas"), [
    ("rtx", "8", 1, 8), ("rtx", "1", 1, 1), ("aws", "44", 2, 8), ("dgx-ext", "88", 2, 16),
    ("aws", "4", 1, 4),
])
def test_exact_placement_rows_are_reproduced_times_slowdown(gpu_type, placement, nodes,
                                                           replicas):
    app = load_app("cifar10")
    for b, (step, sync) in _rows("cifar10", gpu_type, placement).items():
        got = app.step_time(gpu_type, nodes, replicas, b)
        assert got == pytest.approx((step * 1.8, sync * 1.8), rel=1e-12)


def test_node_order_does_not_matter_and_repeats_are_averaged():
    # aws lists both "123" and "132"; (3 nodes, 6 replicas) is "222" if listed.
    p = load_placements("cifar10", "aws")
    assert "132" in p.placement and "123" in p.placement
    app = load_app("cifar10")
    rows = {}
    for pl, b, s, y in zip(p.placement, p.local_bsz, p.step_time, p.sync_time, strict=True):
        if "".join(sorted(pl)) == "222":
            rows.setdefault(int(b), []).append((s, y))
    assert rows
    for b, vals in rows.items():
        mean = tuple(float(np.mean(v)) * 1.8 for v in zip(*vals, strict=True))
        assert app.step_time("aws", 3, 6, b) == pytest.approx(mean, rel=1e-12)


@pytest.mark.parametrize("name", APPS)
def test_interpolation_between_measured_batch_sizes_is_between_them(name):
    app = load_app(name)
    rows = _rows(name, "rtx", "4")
    sizes = sorted(rows)
    for lo, hi in zip(sizes, sizes[1:], strict=False):
        if hi - lo < 2:
            continue
        mid = (lo + hi) // 2
        step, sync = app.step_time("rtx", 1, 4, mid)
        for k, got in enumerate((step, sync)):
            a, b = rows[lo][k] * app.slowdown, rows[hi][k] * app.slowdown
            assert min(a, b) - 1e-12 <= got <= max(a, b) + 1e-12
        w = (mid - lo) / (hi - lo)
        expect = (1 - w) * rows[lo][0] + w * rows[hi][0]
        assert step == pytest.approx(expect * app.slowdown, rel=1e-9)


def test_non_integer_batch_size_interpolates():
    app = load_app("imagenet")
    a, b = app.step_time("aws", 1, 1, 20), app.step_time("aws", 1, 1, 28)
    mid = app.step_time("aws", 1, 1, 24.0)
    assert min(a[0], b[0]) <= mid[0] <= max(a[0], b[0])


@pytest.mark.parametrize("name", APPS)
@pytest.mark.parametrize("cluster", [paper_hetero_cluster(), paper_homo_cluster()],
                         ids=["hetero64", "homo64"])
def test_finite_positive_on_every_configuration(name, cluster):
    app = load_app(name)
    for conf in cluster.configs:
        for b in _bsz_grid(app, conf.gpu_type):
            step, sync = app.step_time(conf.gpu_type, conf.num_nodes, conf.num_gpus, b)
            assert math.isfinite(step) and math.isfinite(sync), (conf, b)
            assert step > 0 and 0 <= sync <= step, (conf, b, step, sync)


@pytest.mark.parametrize("name", APPS)
def test_finite_positive_on_larger_clusters_beyond_the_data(name):
    # 4x the paper's cluster: rtx and dgx-ext go past the measured node counts.
    app = load_app(name)
    for conf in paper_hetero_cluster(4).configs:
        lo, hi = app.local_bsz_limits(conf.gpu_type)
        for b in (lo, hi):
            step, sync = app.step_time(conf.gpu_type, conf.num_nodes, conf.num_gpus, b)
            assert math.isfinite(step) and step > 0 and 0 <= sync <= step


@pytest.mark.parametrize("name", APPS)
def test_more_replicas_process_more_samples_than_one_gpu(name):
    """What the data supports: at the same local batch size, r >= 2 replicas of
    Sia's configurations always beat one GPU's throughput, and are never more
    than 30% superlinear. (Per-step compute time is *not* monotone: dgx-ext and
    rtx 2-GPU placements measured up to ~25% faster steps than 1 GPU.)"""
    app = load_app(name)
    for conf in paper_hetero_cluster().configs + paper_homo_cluster().configs:
        if conf.num_gpus < 2:
            continue
        for b in _bsz_grid(app, conf.gpu_type, 24):
            one, _ = app.step_time(conf.gpu_type, 1, 1, b)
            many, _ = app.step_time(conf.gpu_type, conf.num_nodes, conf.num_gpus, b)
            speedup = conf.num_gpus * one / many
            assert 1.0 < speedup <= 1.3 * conf.num_gpus, (conf, b, speedup)


def test_beyond_measured_batch_sizes_compute_follows_one_gpu():
    # deepspeech2's 2x8 dgx-ext placement was measured only up to local bsz 40.
    app = load_app("deepspeech2")
    rows = _rows("deepspeech2", "dgx-ext", "88")
    top = max(rows)
    assert top < app.local_bsz_limits("dgx-ext")[1]
    step_top, sync_top = app.step_time("dgx-ext", 2, 16, top)
    prev = step_top
    for b in (top + 1, 2 * top, 4 * top, app.local_bsz_limits("dgx-ext")[1]):
        step, sync = app.step_time("dgx-ext", 2, 16, b)
        assert sync == pytest.approx(sync_top)  # all-reduce time held
        assert step >= prev  # compute keeps growing
        prev = step
        one, one_sync = app.step_time("dgx-ext", 1, 1, b)
        one_top, one_sync_top = app.step_time("dgx-ext", 1, 1, top)
        ratio = (step - sync) / (step_top - sync_top)
        assert ratio == pytest.approx((one - one_sync) / (one_top - one_sync_top))
    # Above the 1-GPU range as well: per-sample compute held, never cheaper.
    hi = app.local_bsz_limits("dgx-ext")[1]
    s1, y1 = app.step_time("dgx-ext", 1, 1, hi)
    s2, y2 = app.step_time("dgx-ext", 1, 1, 2 * hi)
    assert y2 == pytest.approx(y1)
    assert (s2 - y2) == pytest.approx(2 * (s1 - y1))


def test_below_measured_batch_sizes_is_held():
    app = load_app("cifar10")
    lo = app.local_bsz_limits("rtx")[0]
    assert app.step_time("rtx", 1, 1, lo / 2) == app.step_time("rtx", 1, 1, lo)


def test_iteration_time_with_accumulation():
    app = load_app("bert")
    step, sync = app.step_time("aws", 2, 8, 8)
    assert app.iteration_time("aws", 2, 8, 8, 0) == step
    assert app.iteration_time("aws", 2, 8, 8, 3) == pytest.approx(step + 3 * (step - sync))


def test_more_replicas_than_nodes_hold_span_more_nodes():
    app = load_app("cifar10")
    assert app.step_time("aws", 1, 8, 64) == app.step_time("aws", 2, 8, 64)


def test_step_time_is_cached_and_repeatable():
    app = load_app("yolov3")
    first = app.step_time("aws", 5, 20, 6)
    assert app.step_time("aws", 5, 20, 6) is first
    assert app._step_time("aws", 5, 20, 6) == first


@pytest.mark.parametrize(("args", "match"), [
    (("h100", 1, 1, 32), "gpu_type"),
    (("aws", 2, 1, 32), "num_nodes"),
    (("aws", 0, 0, 32), "num_nodes"),
    (("aws", 1, 1, 0), "atomic_bsz"),
    (("aws", 1, 1, float("nan")), "atomic_bsz"),
])
def test_bad_requests(args, match):
    with pytest.raises(ValueError, match=match):
        load_app("cifar10").step_time(*args)


def test_max_progress_and_epochs_cifar10():
    app = load_app("cifar10")
    table = load_validation("cifar10", 128)
    assert app.max_progress == float(table.progress[99]) == 39063.0
    assert app.epoch(0.0) == 0
    assert app.epoch(390.9) == 0
    assert app.epoch(391.0) == 1  # the end of epoch 0 starts epoch 1
    assert app.epoch(table.progress[49] - 1) == 49
    assert app.epoch(app.max_progress) == 99
    assert app.epoch(1e12) == 99
    bounds = app.epoch_bounds()
    assert len(bounds) == 100 and bounds[0] == (0.0, 391.0)
    assert bounds[-1][1] == app.max_progress
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))


@pytest.mark.parametrize("name", APPS)
def test_max_progress_is_the_file_value_at_num_epochs(name):
    app = load_app(name)
    table = load_validation(name, app.init_batch_size)
    k = min(app.num_epochs, len(table)) - 1
    assert app.max_progress == float(table.progress[k])
    assert len(app.epoch_bounds()) == k + 1


def test_grad_params_pick_the_epoch_row():
    app = load_app("cifar10")
    table = load_validation("cifar10", 128)
    for progress, row in [(0.0, 0), (100.0, 0), (391.0, 1), (1000.0, 2),
                          (float(table.progress[10]) + 1, 11), (app.max_progress, 99)]:
        assert app.grad_params(progress) == GradParams(
            sqr=float(table.grad_sqr[row]), var=float(table.grad_var[row]))


def test_grad_params_at_a_batch_size_interpolate_its_validation_files():
    """As the Pollux and Sia simulators do: the statistics of training at batch B
    (bracketing files, linear in B, B clamped to their range)."""
    app = load_app("cifar10")
    t1024, t2048 = load_validation("cifar10", 1024), load_validation("cifar10", 2048)
    e = 5
    p = float(t1024.progress[e - 1]) + 1.0  # inside epoch 5
    assert app.epoch(p) == e
    assert app.grad_params(p, 1024) == GradParams(sqr=float(t1024.grad_sqr[e]),
                                                  var=float(t1024.grad_var[e]))
    mid = app.grad_params(p, 1280)  # a quarter of the way to 2048
    assert mid.sqr == pytest.approx(0.75 * t1024.grad_sqr[e] + 0.25 * t2048.grad_sqr[e])
    assert mid.var == pytest.approx(0.75 * t1024.grad_var[e] + 0.25 * t2048.grad_var[e])
    assert app.grad_params(p, 64) == app.grad_params(p, 128) == app.grad_params(p)
    top = load_validation("cifar10", 4096)
    assert app.grad_params(p, 10**6).sqr == pytest.approx(top.grad_sqr[e])
    arr = app.grad_params(p, np.array([1024, 1280]))
    assert arr.sqr == pytest.approx([t1024.grad_sqr[e], mid.sqr])


def test_progress_rate_uses_the_statistics_of_its_batch_size():
    """Regression: the rate used the initial batch size's statistics at every
    batch, understating large batches (bert at 384: 1.5x on average)."""
    app = load_app("bert")
    step, sync = app.step_time("dgx-ext", 1, 8, 48)
    batch = 8 * 48
    for progress in (0.0, app.max_progress - 1.0):
        rate, _, _ = app.progress_rate("dgx-ext", 1, 8, 48, 0, progress)
        want = float(gain(app.grad_params(progress, batch), batch, app.init_batch_size)) / step
        assert rate == pytest.approx(want, rel=1e-12)
        at_init = float(gain(app.grad_params(progress), batch, app.init_batch_size)) / step
        assert rate > 1.1 * at_init


def test_seed_profiles():
    app = load_app("cifar10")
    seeds = load_seed_profiles("cifar10")
    for t in PAPER_TYPES:
        prof = app.seed_profile(t)
        assert isinstance(prof, StepTimes)
        assert prof is seeds[t] or np.array_equal(prof.step_time, seeds[t].step_time)
        assert set(prof.num_replicas.tolist()) == {1}
    assert app.seed_profile("nope") is None
