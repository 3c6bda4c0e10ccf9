"""The torch back-end's parts that need no process: CPU shares of emulated GPUs."""

from __future__ import annotations

import socket

from hypothesis import given
from hypothesis import strategies as s
from torch_support import launch

from sia_grpc.nodeagent.torchworkers.affinity import Affinity
from sia_grpc.nodeagent.torchworkers.environment import free_port, rendezvous


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


def test_a_single_node_world_rendezvouses_elsewhere_when_its_port_is_held():
    """Another job's store (agents sharing a host), or any program, on the directive's
    port: rank 0 would fail with EADDRINUSE; a world all on this node takes a free port
    instead, and a multi-node world keeps the one its other nodes were told."""
    free = launch("job-free", ["true"])
    assert rendezvous(free) == ("127.0.0.1", free.world.master_port)
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        port = held.getsockname()[1]
        single = launch("job-one", ["true"])
        single.world.master_port = port
        addr, got = rendezvous(single)
        assert addr == "127.0.0.1" and got != port
        multi = launch("job-two", ["true"], world_size=4)
        multi.world.master_port = port
        assert rendezvous(multi) == ("node-a", port)
