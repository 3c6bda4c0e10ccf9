"""Loaders of the shipped artifact files, the application table, and ready-made job models."""

import numpy as np
import pytest

from sia_grpc.models import profiles
from sia_grpc.models.bootstrap import JobGoodputModel
from sia_grpc.models.efficiency import GradParams
from sia_grpc.models.profiles import (
    APPLICATIONS,
    available_models,
    available_types,
    job_model_from_artifact,
    load_placements,
    load_scalability,
    load_seed_profiles,
    load_validation,
    validation_batch_sizes,
)

MODELS = ("bert", "cifar10", "deepspeech2", "gpt_pmp", "imagenet", "ncf", "yolov3")
TYPES = ("aws", "azure", "dgx", "dgx-ext", "quad", "rtx")


def test_reads_the_package_copy():
    root = profiles._root()
    assert str(root).replace("\\", "/").endswith("sia_grpc/data/artifact")
    assert "shared" not in str(root)


def test_models_and_types():
    assert available_models() == MODELS
    for m in MODELS:
        want = ("dgx-ext", "rtx") if m == "gpt_pmp" else TYPES
        assert available_types(m) == want
    assert validation_batch_sizes("cifar10") == (128, 256, 512, 1024, 2048, 4096)


@pytest.mark.parametrize("model", MODELS)
def test_every_file_loads_with_rows(model):
    for t in available_types(model):
        for table in (load_placements(model, t), load_scalability(model, t)):
            assert len(table) > 0
            assert np.all(table.local_bsz >= 1) and np.all(table.step_time > 0)
            assert np.all(table.num_nodes >= 1)
            assert np.all(table.num_replicas >= table.num_nodes)
    for b in validation_batch_sizes(model):
        v = load_validation(model, b)
        assert len(v) > 0 and v.init_batch_size == b
        assert np.all(np.diff(v.progress) > 0)


def test_columns_parsed_by_name():
    # placements-aws.csv starts with `placement`, placements-rtx.csv with `local_bsz`.
    aws = load_placements("cifar10", "aws")
    assert (aws.placement[0], aws.local_bsz[0]) == ("1", 32)
    assert aws.step_time[0] == pytest.approx(0.0427886962890625)
    rtx = load_placements("cifar10", "rtx")
    assert rtx.local_bsz.min() == 32 and rtx.local_bsz.max() == 1024
    # scalability-aws.csv starts with num_nodes; the others with local_bsz.
    s = load_scalability("cifar10", "aws")
    assert (s.num_nodes[0], s.num_replicas[0], s.local_bsz[0]) == (6, 6, 32)


def test_placement_digits():
    p = load_placements("cifar10", "aws")
    i = p.placement.index("44")
    assert (p.num_nodes[i], p.num_replicas[i]) == (2, 8)
    i = p.placement.index("1112")
    assert (p.num_nodes[i], p.num_replicas[i]) == (4, 5)


def test_tables_are_read_only():
    p = load_placements("bert", "rtx")
    with pytest.raises(ValueError):
        p.step_time[0] = 1.0


def test_seed_profiles_type_names():
    seeds = load_seed_profiles("cifar10")
    assert set(seeds) == set(TYPES)  # t4 -> aws, v100 -> azure, dgx -> dgx and dgx-ext
    assert "t4" not in seeds and "v100" not in seeds
    np.testing.assert_array_equal(seeds["dgx-ext"].step_time, seeds["dgx"].step_time)
    for table in seeds.values():
        assert len(table) > 0
        assert np.all(table.num_replicas == 1)
    assert load_seed_profiles("gpt_pmp") == {}
    # aws rows are the t4 rows of the file, which match the 1-GPU aws placements.
    aws = seeds["aws"]
    place = load_placements("cifar10", "aws")
    one = np.array([p == "1" for p in place.placement])
    common = np.intersect1d(aws.local_bsz, place.local_bsz[one])
    assert common.size > 3


def test_applications_table():
    assert set(APPLICATIONS) == set(MODELS)
    assert APPLICATIONS["cifar10"].num_epochs == 100
    assert APPLICATIONS["imagenet"].restart_delay == 250.0
    assert APPLICATIONS["ncf"].slowdown == 1.5
    # The validation files cover exactly the run length.
    for m, app in APPLICATIONS.items():
        assert len(load_validation(m, validation_batch_sizes(m)[0])) == app.num_epochs
    with pytest.raises(TypeError):
        APPLICATIONS["bert"] = None


def test_job_model_from_artifact():
    job = job_model_from_artifact("cifar10", gpu_types=["aws", "rtx", "dgx-ext"])
    assert isinstance(job, JobGoodputModel)
    assert (job.init_batch_size, job.max_batch_size) == (128, 4096)
    assert job.local_bsz_limits == {"aws": (32, 1024), "rtx": (32, 1024), "dgx-ext": (32, 4096)}
    assert job.gpu_types == ("aws", "dgx-ext", "rtx")
    v = load_validation("cifar10", 128)
    assert job.grad == GradParams(float(v.grad_sqr[0]), float(v.grad_var[0]))
    late = job_model_from_artifact("cifar10", gpu_types=["aws"], progress=1.0)
    assert late.grad == GradParams(float(v.grad_sqr[-1]), float(v.grad_var[-1]))

    nodes, reps = np.array([1, 1, 1, 2]), np.array([1, 2, 4, 8])
    est = job.evaluate("dgx-ext", nodes, reps)
    assert np.all(est.goodput > 0)
    assert job.evaluate("quad", nodes, reps).goodput.sum() == 0  # type not requested
    # Bootstrap: linear scaling before multi-GPU runs.
    e1 = job.evaluate("aws", nodes[:1], reps[:1], fixed_batch_size=128)
    e2 = job.evaluate("aws", nodes[1:2], reps[1:2], fixed_batch_size=256)
    assert e2.throughput[0] == pytest.approx(2 * e1.throughput[0], rel=1e-12)
    # Each call has its own estimator.
    other = job_model_from_artifact("cifar10", gpu_types=["aws", "rtx", "dgx-ext"])
    assert other.estimator is not job.estimator
    p = load_placements("cifar10", "aws")
    job.estimator.add_observation("aws", p.num_nodes, p.num_replicas, p.local_bsz, 0,
                                  p.step_time, p.sync_time)
    assert other.estimator.num_multi_gpu("aws") == 0


def test_oracle_model_fits_every_type():
    job = job_model_from_artifact("imagenet", gpu_types=["aws", "rtx"], bootstrap=False)
    for t in ("aws", "rtx"):
        assert job.estimator.num_multi_gpu(t) > 0
        p = load_placements("imagenet", t)
        pred = job.estimator.step_time(t, p.num_nodes, p.num_replicas, p.local_bsz, 0)
        assert np.median(np.abs(pred / p.step_time - 1)) < 0.1


def test_gpt_pmp_cannot_be_bootstrapped():
    with pytest.raises(ValueError, match="seed profiles"):
        job_model_from_artifact("gpt_pmp", gpu_types=["rtx"])
