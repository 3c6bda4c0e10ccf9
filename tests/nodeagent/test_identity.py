"""Job users (isolation/identity.py): never root or the agent, never shared between
two jobs of different tenants, even across agents on one machine."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_grpc.nodeagent.isolation.identity import UserPolicy, parse_uid_range, parse_user

RANGE = (230_000, 230_009)


def test_two_agents_on_one_machine_never_hand_out_the_same_uid(tmp_path):
    a = UserPolicy(uid_range=RANGE, claims=str(tmp_path))
    b = UserPolicy(uid_range=RANGE, claims=str(tmp_path))
    ua, ub = a.acquire("t/1", "t"), b.acquire("u/1", "u")
    assert ua.uid != ub.uid and ua.dynamic and ub.dynamic
    assert a.acquire("t/1", "t") == ua  # the same job keeps its user
    a.release("t/1")
    assert b.acquire("t/1", "t").uid == ua.uid  # released: free for anyone again


def test_the_same_job_picks_the_same_uid_on_two_nodes(tmp_path):
    """Two agents of one job (two machines: claims apart) pick the same uid, so its
    files on shared storage keep one owner."""
    keys = [f"t/{i:032x}" for i in range(5)]
    for key in keys:
        a = UserPolicy(uid_range=(200_000, 265_535), claims=str(tmp_path / "a"))
        b = UserPolicy(uid_range=(200_000, 265_535), claims=str(tmp_path / "b"))
        assert a.acquire(key, "t").uid == b.acquire(key, "t").uid
        a.release(key)
        b.release(key)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 4), st.booleans()),
                max_size=40))
def test_no_two_held_jobs_share_a_dynamic_uid(tmp_path_factory, steps):
    claims = str(tmp_path_factory.mktemp("claims"))
    agents = {"a": UserPolicy(uid_range=RANGE, claims=claims),
              "b": UserPolicy(uid_range=RANGE, claims=claims)}
    for agent, job, release in steps:
        key = f"{agent}/{job}"
        if release:
            agents[agent].release(key)
        else:
            agents[agent].acquire(key, key)
        held = [u.uid for p in agents.values() for u in p._held.values()]
        assert len(held) == len(set(held))
        assert all(RANGE[0] <= uid <= RANGE[1] for uid in held)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs a process as a range uid")
def test_a_uid_that_still_runs_a_process_is_not_handed_out(tmp_path):
    left = subprocess.Popen(["setpriv", "--reuid", str(RANGE[0]), "--regid", str(RANGE[0]),
                             "--clear-groups", "sleep", "30"])
    try:
        for _ in range(500):  # until setpriv has switched
            if os.stat(f"/proc/{left.pid}").st_uid == RANGE[0]:
                break
            time.sleep(0.01)
        policy = UserPolicy(uid_range=(RANGE[0], RANGE[0] + 1), claims=str(tmp_path))
        assert policy.acquire("t/1", "t").uid == RANGE[0] + 1
    finally:
        left.kill()
        left.wait()


def test_tenant_users_are_fixed_and_checked(tmp_path):
    policy = UserPolicy(tenants={"team-a": (1500, 1500)}, uid_range=RANGE, claims=str(tmp_path))
    u = policy.acquire("team-a/1", "team-a")
    assert (u.uid, u.gid, u.dynamic) == (1500, 1500, False)
    assert policy.acquire("team-a/2", "team-a").uid == 1500
    with pytest.raises(ValueError, match="never share"):
        UserPolicy(tenants={"a": (1500, 1500), "b": (1500, 1501)}, claims=str(tmp_path))
    with pytest.raises(ValueError, match="inside the per-job range"):
        UserPolicy(tenants={"a": (RANGE[0], RANGE[0])}, uid_range=RANGE, claims=str(tmp_path))
    with pytest.raises(ValueError, match="root"):
        UserPolicy(tenants={"a": (0, 0)}, claims=str(tmp_path))


def test_parsing_names_what_is_wrong():
    assert parse_uid_range("200000-265535") == (200_000, 265_535)
    assert parse_user("1500") == (1500, 1500)
    for bad in ("200000", "5-1", "x-y", "10-20"):
        with pytest.raises(ValueError, match="uid range"):
            parse_uid_range(bad)
    with pytest.raises(ValueError, match="never root"):
        parse_user("0:0")
