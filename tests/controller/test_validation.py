"""`resolve(spec)`: every bad field is named in an INVALID_ARGUMENT, and nothing
else ever escapes."""

from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError
from sia_grpc.api.validation import resolve


def good(**kw) -> pb.JobSpec:
    spec = pb.JobSpec(name="j", application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE)
    for k, v in kw.items():
        if k == "command":
            spec.command.extend(v)
        elif k == "allowed_gpu_types":
            spec.allowed_gpu_types.extend(v)
        else:
            setattr(spec, k, v)
    return spec


@pytest.mark.parametrize(("kw", "field"), [
    ({"name": "bad name"}, "spec.name"),
    ({"adaptivity": 0}, "spec.adaptivity"),
    ({"application": ""}, "spec.application"),
    ({"application": "x" * 129}, "spec.application"),
    ({"application": "mine"}, "spec.application"),  # unknown and no command
    ({"command": ["python"] * 257}, "spec.command"),
    ({"command": ["python", "a" * 4097]}, "spec.command[1]"),
    ({"command": ["python", "a\x00b"]}, "spec.command[1]"),
    ({"command": ["", "train.py"]}, "spec.command[0]"),
    ({"allowed_gpu_types": [f"t{i}" for i in range(65)]}, "spec.allowed_gpu_types"),
    ({"min_gpus": 4, "max_gpus": 2}, "spec.max_gpus"),
    ({"max_gpus": 1 << 20}, "spec.max_gpus"),
    ({"batch_size": 1 << 25}, "spec.batch_size"),
    ({"epochs": math.nan}, "spec.epochs"),
    ({"epochs": 1e7}, "spec.epochs"),
    ({"samples": 1 << 50}, "spec.samples"),
    ({"restart_cost_s": -1.0}, "spec.restart_cost_s"),
    ({"tenant": "a b"}, "spec.tenant"),
    ({"memory_mib_per_gpu": 1}, "spec.memory_mib_per_gpu"),
    ({"memory_mib_per_gpu": (4 << 20) + 1}, "spec.memory_mib_per_gpu"),
])
def test_each_bad_field_is_named(kw, field):
    with pytest.raises(ApiError) as err:
        resolve(good(**kw))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.field == field, err.value.message


def test_a_real_job_needs_its_batch_limits_and_initial_batch():
    spec = good(application="mlp", command=["python", "train.py"])
    with pytest.raises(ApiError, match="type_batch_limits"):
        resolve(spec)
    spec.type_batch_limits.add(gpu_type="rtx", min_local_batch_size=8, max_local_batch_size=256)
    with pytest.raises(ApiError, match="batch_size"):
        resolve(spec)
    spec.batch_size = 64
    res = resolve(spec)
    assert res.init_batch_size == 64 and res.local_bsz_limits == {"rtx": (8, 256)}


_text = st.text(max_size=80)
_spec = st.builds(
    pb.JobSpec, name=_text, application=st.sampled_from(["cifar10", "bert", "", "mine"]) | _text,
    command=st.lists(_text, max_size=4), adaptivity=st.integers(0, 5),
    min_gpus=st.integers(0, 1 << 20), max_gpus=st.integers(0, 1 << 20),
    num_gpus=st.integers(0, 1 << 20), batch_size=st.integers(0, 1 << 30),
    max_batch_size=st.integers(0, 1 << 30), pipeline_gpus=st.integers(0, 16),
    epochs=st.floats(allow_nan=True, allow_infinity=True),
    restart_cost_s=st.floats(allow_nan=True, allow_infinity=True), tenant=_text,
    allowed_gpu_types=st.lists(_text, max_size=3))


@settings(max_examples=300, deadline=None)
@given(_spec)
def test_any_spec_resolves_or_names_a_field(spec):
    try:
        res = resolve(spec)
    except ApiError as err:
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.field.startswith("spec.")
        return
    assert res.min_gpus >= 1 and res.init_batch_size >= 1 and res.max_batch_size >= 1
    assert math.isfinite(res.restart_cost) and res.restart_cost >= 0
