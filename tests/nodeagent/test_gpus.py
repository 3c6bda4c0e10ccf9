"""GPU discovery, declaration and emulation pace; the worker-service pieces."""

from __future__ import annotations

import sys

import pytest

from sia_grpc.api import pb
from sia_grpc.nodeagent.gpus import (
    DEFAULT_PACE_APPLICATION,
    NodeGpus,
    discover_nvml,
    emulated_types,
    emulation_pace,
    gpu_type_for,
    parse_gpu_spec,
    resolve_inventory,
    unknown_type_warning,
)
from sia_grpc.nodeagent.torchbackend import safe_name
from sia_grpc.nodeagent.workers import describe_exit


@pytest.mark.parametrize(("name", "gpu_type"), [
    ("NVIDIA A100-SXM4-40GB", "dgx-ext"), ("Tesla V100-SXM2-32GB", "azure"),
    ("Tesla T4", "aws"), ("NVIDIA GeForce RTX 2080 Ti", "rtx"),
    ("Quadro RTX 6000", "quad"), ("NVIDIA H200", "h200"), ("NVIDIA GeForce RTX 4090",
                                                           "geforce-rtx-4090"),
])
def test_nvml_names_map_to_profile_types(name, gpu_type):
    assert gpu_type_for(name) == gpu_type


def test_parse_gpu_spec_wants_one_type():
    assert parse_gpu_spec("dgx-ext:8") == ("dgx-ext", 8)
    with pytest.raises(ValueError, match="run one agent per type"):
        parse_gpu_spec("rtx:2,a100:2")
    with pytest.raises(ValueError, match="expected TYPE:COUNT"):
        parse_gpu_spec("rtx:0")


@pytest.mark.parametrize(("declared", "gpu_type"), [
    ("a100:4", "dgx-ext"), ("A100:4", "dgx-ext"), ("v100:2", "azure"), ("t4:1", "aws"),
    ("rtx:8", "rtx"), ("dgx-ext:8", "dgx-ext"), ("H100:8", "h100"),
])
def test_declared_types_are_named_as_discovery_names_them(declared, gpu_type):
    """Regression (defect: `--gpus a100:4` registered 'a100' GPUs no job could use,
    while NVML discovery of the same A100s gave 'dgx-ext')."""
    assert parse_gpu_spec(declared)[0] == gpu_type


def test_a_type_no_profile_knows_is_warned_about():
    assert unknown_type_warning("dgx-ext") is None and unknown_type_warning("rtx") is None
    warning = unknown_type_warning("h100")
    assert warning.startswith("GPU type 'h100' has no shipped profile (known: aws, azure,")
    assert "type_batch_limits" in warning


def test_pace_is_relative_to_the_fastest_type():
    paces = {t: emulation_pace(t) for t in emulated_types()}
    assert min(paces.values()) == 1.0
    assert paces["dgx-ext"] == 1.0 and paces["aws"] > paces["rtx"] > 1.0
    # A job's own application when it has a profile for the type, else the default.
    assert emulation_pace("aws", "bert") != emulation_pace("aws", DEFAULT_PACE_APPLICATION)
    assert emulation_pace("aws", "unknown-app") == emulation_pace("aws")
    with pytest.raises(ValueError, match="cannot emulate GPU type 'a100'"):
        emulation_pace("a100")


def test_inventory_resolution():
    nvml = NodeGpus("dgx-ext", 8, "nvml", ("NVIDIA A100",) * 8)
    assert resolve_inventory(nvml=lambda: nvml) == nvml
    assert resolve_inventory(declared=("dgx", 4), nvml=lambda: nvml) == NodeGpus(
        "dgx", 4, "declared", ("NVIDIA A100",) * 4)
    with pytest.raises(ValueError, match="declares 9 GPUs but NVML finds 8"):
        resolve_inventory(declared=("dgx", 9), nvml=lambda: nvml)
    assert resolve_inventory(declared=("rtx", 2), nvml=lambda: None) == NodeGpus(
        "rtx", 2, "declared")
    with pytest.raises(ValueError, match="no GPUs found"):
        resolve_inventory(nvml=lambda: None)
    emu = resolve_inventory(emulate=("quad", 4), nvml=lambda: pytest.fail("no NVML"))
    assert emu.emulated and (emu.gpu_type, emu.count) == ("quad", 4)
    with pytest.raises(ValueError, match="not both"):
        resolve_inventory(declared=("rtx", 2), emulate=("rtx", 2))


def test_nvml_is_optional(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if not installed
    assert discover_nvml() is None


def test_safe_names_and_exit_descriptions():
    assert safe_name("job-1.a_b") == "job-1.a_b"
    for bad in ("../x", "..", ".", "", "a/b"):
        name = safe_name(bad)
        assert "/" not in name and name not in ("", ".", "..")
    assert safe_name("a/b") != safe_name("a_b")
    assert describe_exit(75) == "exit code 75" and describe_exit(-9) == "killed by SIGKILL"


def test_accumulator_without_reports_takes_nothing():
    from sia_grpc.nodeagent.workerservice import TelemetryAccumulator

    acc = TelemetryAccumulator("j", 1, "rtx")
    assert acc.take() is None
    acc.add(pb.Telemetry(job_id="j", generation=1, samples=[pb.ThroughputSample(
        num_nodes=1, num_replicas=1, atomic_batch_size=8, step_time_s=0.5, count=0)]))
    (s,) = acc.take().samples  # a sample without a count counts once; its type filled in
    assert (s.gpu_type, s.count, s.step_time_s) == ("rtx", 1, 0.5)


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
                                  "NVIDIA H200", "NVIDIA H200 NVL"])
def test_an_h100_is_its_own_type_with_no_shipped_profile(name):
    """The decision for GPUs newer than the profiles (docs/gpu-check.md): an H100/H200
    node registers as h100/h200 whatever the variant, the same type `--gpus h100:N`
    declares; not renamed to a profiled type (its speed is not an A100's): the agent
    warns that only jobs naming the type run there, each profiled on arrival."""
    gpu_type = gpu_type_for(name)
    assert gpu_type == ("h100" if "H100" in name else "h200")
    assert parse_gpu_spec(f"{gpu_type.upper()}:8")[0] == gpu_type
    found = NodeGpus(gpu_type, 8, "nvml", (name,) * 8)
    assert resolve_inventory(nvml=lambda: found) == found
    warning = unknown_type_warning(gpu_type)
    assert f"only jobs whose type_batch_limits name {gpu_type!r} can run here" in warning
    assert "profiles each of them on it when it arrives" in warning
    # An operator's explicit rename is taken as given (the agent's --gpus TYPE:COUNT).
    assert resolve_inventory(declared=parse_gpu_spec("dgx-ext:8"), nvml=lambda: found) == (
        NodeGpus("dgx-ext", 8, "declared", (name,) * 8))
