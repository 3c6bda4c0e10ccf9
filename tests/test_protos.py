"""The committed generated code matches protos/ exactly, and imports cleanly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "protogen", Path(__file__).resolve().parents[1] / "scripts" / "protogen.py")
protogen = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(protogen)


def test_generated_code_is_current(tmp_path: Path):
    fresh = tmp_path / "_proto"
    protogen.generate(fresh)
    committed = protogen.OUT
    fresh_files = {p.relative_to(fresh): p for p in fresh.rglob("*") if p.is_file()}
    committed_files = {p.relative_to(committed): p for p in committed.rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts}
    assert sorted(fresh_files) == sorted(committed_files), "run `make protos`"
    stale = [str(k) for k, p in fresh_files.items()
             if p.read_bytes() != committed_files[k].read_bytes()]
    assert not stale, f"stale generated files (run `make protos`): {stale}"


def test_api_exposes_messages_enums_and_services():
    from sia_grpc.api import SERVICE_NAMES, pb

    spec = pb.JobSpec(name="a", application="cifar10", adaptivity=pb.ADAPTIVITY_RIGID,
                      num_gpus=4, batch_size=512)
    assert pb.JobSpec.FromString(spec.SerializeToString()) == spec
    assert pb.JOB_STATE_QUEUED != pb.JOB_STATE_UNSPECIFIED == 0
    assert SERVICE_NAMES == ("sia.v1.JobService", "sia.v1.ClusterService",
                             "sia.v1.AgentService", "sia.v1.PolicyService")
