"""The torch back-end's parts that need no process: CPU shares of emulated GPUs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as s

from sia_grpc.nodeagent.torchworkers.affinity import Affinity


@given(gpus=s.integers(1, 8), cores=s.integers(1, 32))
def test_emulated_gpus_share_the_cores_out(gpus, cores):
    a = Affinity(gpus, tuple(range(100, 100 + cores)), emulate=True, visible=None)
    shares = [a.cpu_share(g) for g in range(gpus)]
    assert all(shares), shares
    if cores >= gpus:  # disjoint, as equal as can be, and all cores used
        assert sorted(c for share in shares for c in share) == list(a.cpus)
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    else:  # fewer cores than GPUs: one core each, round robin
        assert shares == [[a.cpus[g % cores]] for g in range(gpus)]
    assert a.env(0, [0])["OMP_NUM_THREADS"] == str(len(shares[0]))
    assert a.pinned_cpus(0) == shares[0]


def test_real_gpus_map_through_the_agents_visible_devices():
    a = Affinity.of_agent(4, [0, 1], emulate=False, environ={"CUDA_VISIBLE_DEVICES": "4, 5,6"})
    assert a.env(2, [2, 0, 3]) == {"CUDA_VISIBLE_DEVICES": "6,4,3"}  # 3: past the list
    assert a.pinned_cpus(1) is None
    assert Affinity.of_agent(2, [0], emulate=False, environ={}).env(1, [1, 0]) == {
        "CUDA_VISIBLE_DEVICES": "1,0"}
