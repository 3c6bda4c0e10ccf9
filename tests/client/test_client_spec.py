"""Spec files: the three formats give the same JobSpec, and each mistake names its field."""

from __future__ import annotations

import pytest

from sia_grpc.api import pb
from sia_grpc.client import SpecError, load_spec, spec_from_mapping, spec_to_mapping

YAML = """\
name: resnet
application: cifar10
adaptivity: strong-scaling
min_gpus: 2
max_gpus: 8
allowed_gpu_types: [rtx, t4]
batch_size: 256
type_batch_limits:
  rtx: {min: 16, max: 128}
epochs: 30
command: python train.py --lr "0.1 0.2"
tenant: vision
labels: {team: ml}
"""

TOML = """\
name = "resnet"
application = "cifar10"
adaptivity = "strong-scaling"
min_gpus = 2
max_gpus = 8
allowed_gpu_types = ["rtx", "t4"]
batch_size = 256
epochs = 30
command = ["python", "train.py", "--lr", "0.1 0.2"]
tenant = "vision"
type_batch_limits = { rtx = { min = 16, max = 128 } }
labels = { team = "ml" }
"""

JSON = """{"name": "resnet", "application": "cifar10", "adaptivity": "strong-scaling",
 "min_gpus": 2, "max_gpus": 8, "allowed_gpu_types": ["rtx", "t4"], "batch_size": 256,
 "type_batch_limits": {"rtx": {"min": 16, "max": 128}}, "epochs": 30,
 "command": ["python", "train.py", "--lr", "0.1 0.2"], "tenant": "vision",
 "labels": {"team": "ml"}}
"""

EXPECTED = pb.JobSpec(
    name="resnet", application="cifar10", adaptivity=pb.ADAPTIVITY_STRONG_SCALING,
    min_gpus=2, max_gpus=8, allowed_gpu_types=["rtx", "t4"], batch_size=256,
    type_batch_limits=[pb.TypeBatchLimits(gpu_type="rtx", min_local_batch_size=16,
                                          max_local_batch_size=128)],
    epochs=30, command=["python", "train.py", "--lr", "0.1 0.2"], tenant="vision",
    labels={"team": "ml"})


@pytest.mark.parametrize("name,text", [("job.yaml", YAML), ("job.yml", YAML),
                                       ("job.toml", TOML), ("job.json", JSON)])
def test_each_format_loads_the_same_spec(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert load_spec(path) == EXPECTED


def test_to_mapping_round_trips():
    assert spec_from_mapping(spec_to_mapping(EXPECTED)) == EXPECTED
    assert spec_to_mapping(pb.JobSpec(name="x")) == {"name": "x"}  # defaults left out
    explicit_zero = pb.JobSpec(samples=0)  # the oneof choice survives a zero
    assert spec_to_mapping(explicit_zero) == {"samples": 0}
    assert spec_from_mapping({"samples": 0}).WhichOneof("target") == "samples"


@pytest.mark.parametrize("data,field,message", [
    ({"min_gpu": 4}, "spec.min_gpu", "spec.min_gpu: unknown field (did you mean min_gpus?)"),
    ({"bogus": 1}, "spec.bogus", "spec.bogus: unknown field"),
    ({"min_gpus": "four"}, "spec.min_gpus",
     "spec.min_gpus: expected a non-negative integer, got 'four'"),
    ({"max_gpus": -2}, "spec.max_gpus", "spec.max_gpus: expected a non-negative integer, got -2"),
    ({"num_gpus": True}, "spec.num_gpus",
     "spec.num_gpus: expected a non-negative integer, got True"),
    ({"epochs": -1.5}, "spec.epochs", "spec.epochs: expected a non-negative number, got -1.5"),
    ({"epochs": 3, "samples": 100}, "spec.samples",
     "spec.samples: set epochs or samples, not both"),
    ({"adaptivity": "elastic"}, "spec.adaptivity",
     "spec.adaptivity: expected one of adaptive, strong-scaling, rigid, got 'elastic'"),
    ({"labels": {"team": 7}}, "spec.labels.team", "spec.labels.team: expected a string, got 7"),
    ({"command": [1]}, "spec.command[0]", "spec.command[0]: expected a string, got 1"),
    ({"command": "python 'unclosed"}, "spec.command",
     "spec.command: cannot split into words: No closing quotation"),
    ({"type_batch_limits": {"rtx": {"mn": 1}}}, "spec.type_batch_limits.rtx.mn",
     "spec.type_batch_limits.rtx.mn: unknown field (did you mean min?)"),
    ({"type_batch_limits": [1]}, "spec.type_batch_limits",
     "spec.type_batch_limits: expected a mapping of GPU type to {min, max}, got [1]"),
])
def test_mistakes_name_their_field(data, field, message):
    with pytest.raises(SpecError) as err:
        spec_from_mapping(data)
    assert err.value.field == field and str(err.value) == message


def test_file_errors_carry_the_path_and_line(tmp_path):
    cases = {"bad.yaml": ("name: x\nmin_gpus: [1\n", 3),  # YAML: where the open list ends
             "bad.toml": ('name = "x"\nmin_gpus = = 2\n', 2),
             "bad.json": ('{"name": "x",\n "min_gpus": }\n', 2)}
    for name, (text, line) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(SpecError) as err:
            load_spec(path)
        assert err.value.line == line, name
        kind = name.split(".")[1].upper()
        assert str(err.value).startswith(f"{path}:{line}: invalid {kind}: "), str(err.value)
    assert "(column 12)" in str(_error(tmp_path / "bad.toml"))

    field_error = tmp_path / "typo.yaml"
    field_error.write_text("min_gpu: 1\n")
    with pytest.raises(SpecError) as err:
        load_spec(field_error)
    assert err.value.field == "spec.min_gpu"
    assert str(err.value) == f"{field_error}: spec.min_gpu: unknown field (did you mean min_gpus?)"


def test_unusable_files(tmp_path):
    (tmp_path / "job.txt").write_text("name: x")
    with pytest.raises(SpecError, match="unknown file type '.txt'"):
        load_spec(tmp_path / "job.txt")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(SpecError, match="spec: expected a mapping of JobSpec fields, got nothing"):
        load_spec(tmp_path / "empty.yaml")
    with pytest.raises(FileNotFoundError):
        load_spec(tmp_path / "missing.yaml")


def _error(path) -> SpecError:
    try:
        load_spec(path)
    except SpecError as err:
        return err
    raise AssertionError(f"{path} loaded")
