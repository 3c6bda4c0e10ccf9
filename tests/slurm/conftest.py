"""The live bridge tests' cluster: sia_grpc/testing/slurm.py's slurmctld and three slurmd
on this machine (rtx-0 and rtx-1 with 4 rtx GPUs each, a100-0 with 4 a100, which the
bridge maps onto the profiles' dgx-ext), one per test module; each test starts with no
jobs and every node up. Skips, saying why, where Slurm cannot run (`make venv`
installs Debian's slurm-wlm as root)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sia_grpc.slurm.commands import Slurm
from sia_grpc.testing import slurm as testing_slurm


@pytest.fixture(scope="module")
def cluster() -> Iterator[testing_slurm.SlurmCluster]:
    reason = testing_slurm.unavailable()
    if reason is not None:
        pytest.skip(f"Slurm: {reason}")
    with testing_slurm.SlurmCluster() as c:
        yield c


@pytest.fixture
def slurm(cluster, tmp_path, monkeypatch) -> Iterator[Slurm]:
    """The cluster with no jobs and every node up; commands run with its SLURM_CONF,
    job files go to tmp_path."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    monkeypatch.chdir(tmp_path)
    yield Slurm()
    cluster.cancel_all()
    for node in cluster.nodes:
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
