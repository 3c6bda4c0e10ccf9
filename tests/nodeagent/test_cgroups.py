"""Job cgroups on this host's real cgroups (as root), and v2's layout on a fake cgroup2 tree."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sia_grpc.nodeagent.isolation.cgroups import (
    CgroupError,
    CgroupSupport,
    JobCgroups,
    JobLimits,
    probe,
    sweep_stale,
)

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root: cgroups"),
              pytest.mark.timeout(60)]

MiB = 1 << 20
NOBODY = 64000  # a uid no account uses


@pytest.fixture
def support() -> CgroupSupport:
    found = probe()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture
def base(support: CgroupSupport) -> Iterator[str]:
    """A base folder of this test's own, swept and removed afterwards."""
    name = f"sia-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        yield name
    finally:
        sweep_stale(support, name)
        for _c, d in support.agent_dirs:
            if os.path.isdir(os.path.join(d, name)):
                os.rmdir(os.path.join(d, name))


@pytest.fixture
def make_job(support: CgroupSupport, base: str) -> Iterator[Callable[..., JobCgroups]]:
    made: list[JobCgroups] = []

    def make(name: str = "job-g1", **limits: object) -> JobCgroups:
        limits.setdefault("memory_bytes", 64 * MiB)
        limits.setdefault("pids_max", 20)
        job = JobCgroups.create(support, base, name, JobLimits(**limits))  # type: ignore[arg-type]
        made.append(job)
        return job

    try:
        yield make
    finally:
        for job in made:
            assert job.kill_and_wait_sync(5.0), job.pids()
            assert job.remove()


Spawned = subprocess.Popen[str]


def spawn_in(job: JobCgroups, argv: list[str]) -> Spawned:
    """A launcher: a shell that writes its pid into every procs file, then execs argv."""
    join = "".join(f"echo $$ > {shlex.quote(f)} || exit 99; " for f in job.procs_files)
    return subprocess.Popen(["sh", "-c", join + 'exec "$@"', "sh", *argv], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def python_in(job: JobCgroups, code: str) -> Spawned:
    return spawn_in(job, [sys.executable, "-c", code])


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def finish(p: Spawned, timeout_s: float = 10.0) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout_s)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, out, err


def test_probe_describes_this_host(support: CgroupSupport) -> None:
    assert "memory" in support.controllers
    assert support.describe().startswith(f"cgroup v{support.version}: memory")
    # below our own cgroup, never beside it
    own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().split())
    if support.version == 1:
        assert dict(support.agent_dirs)["memory"].endswith(own["memory"].rstrip("/"))


def test_memory_limit_kills_and_is_counted(make_job: Callable[..., JobCgroups]) -> None:
    job = make_job()
    assert job.memory().limit_bytes == 64 * MiB
    p = python_in(job, "b = b'x' * (200 << 20); print('survived')")
    rc, out, _err = finish(p)
    assert rc == -9 and "survived" not in out
    stats = job.memory()
    assert stats.oom_kills is None or stats.oom_kills >= 1
    assert stats.peak_bytes is not None and stats.peak_bytes >= 60 * MiB
    if job.support.version == 1:  # (failcnt stays 0 on this 6.18 kernel: not asserted)
        assert stats.oom_kills is not None and isinstance(stats.failcnt, int)


FORK_50 = """
import os, time
n = 0
for _ in range(50):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    except OSError:
        pass
print(n, flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("freezer", [True, False], ids=["frozen-kill", "plain-kill"])
async def test_pids_max_holds_a_fork_bomb(make_job: Callable[..., JobCgroups],
                                          freezer: bool) -> None:
    job = make_job(memory_bytes=None)
    assert job.memory().limit_bytes is None
    if not freezer:  # kill() without a freezer: SIGKILL rounds until no new pid shows up
        s = job.support
        job.support = replace(s, controllers=s.controllers - {"freezer"})
        job._dirs.pop("freezer", None)
    p = python_in(job, FORK_50)
    try:
        assert p.stdout is not None
        forked = int(p.stdout.readline())
        assert forked == 19  # the parent is the 20th task
        assert len(job.pids()) == 20
        assert await job.kill_and_wait(5.0)
    finally:
        rc, _out, _err = finish(p)
    assert rc == -9 and job.empty() and job.pids() == set()


DOUBLE_FORK = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


async def test_setsid_double_fork_stays_in_and_is_killed(
        make_job: Callable[..., JobCgroups]) -> None:
    job = make_job()
    p = python_in(job, DOUBLE_FORK)
    try:
        assert p.stdout is not None
        escaped = int(p.stdout.readline())
        assert escaped in job.pids()
        assert os.getsid(escaped) != os.getsid(0)
        assert job.remove() is False  # not while anything is in it
        assert all(os.path.isdir(f.rpartition("/")[0]) for f in job.procs_files)
        assert await job.kill_and_wait(5.0)  # our child p is a zombie: it does not count
        wait_for(lambda: not Path(f"/proc/{escaped}").exists()
                 or Path(f"/proc/{escaped}/stat").read_text().split()[2] == "Z")
    finally:
        rc, _out, _err = finish(p)  # reap it, as the agent's child watcher would
    assert rc == -9 and job.empty()


def test_a_tenant_cannot_move_itself_out(make_job: Callable[..., JobCgroups],
                                         support: CgroupSupport, base: str) -> None:
    job = make_job()
    agent = dict(support.agent_dirs)["memory"]
    moves = "".join(f"echo $$ > {shlex.quote(os.path.join(d, 'cgroup.procs'))} && echo MOVED; "
                    for d in (os.path.join(agent, base), agent))  # the job's parent, the agent's
    p = spawn_in(job, ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                       "sh", "-c", moves + "cat /proc/self/cgroup"])
    rc, out, err = finish(p)
    assert "MOVED" not in out and err.count("Permission denied") == 2, (out, err)
    mem = next(line for line in out.split() if ":memory:" in line)
    assert mem.endswith("/" + job.name)


def test_cpuset_pins(make_job: Callable[..., JobCgroups], support: CgroupSupport) -> None:
    last = max(os.sched_getaffinity(0))
    job = make_job(cpus=(last,))
    p = python_in(job, "print(open('/proc/self/status').read())")
    rc, out, _err = finish(p)
    assert rc == 0
    allowed = next(line for line in out.splitlines() if line.startswith("Cpus_allowed_list"))
    assert allowed.split()[-1] == str(last)


def test_devices_allow_list(make_job: Callable[..., JobCgroups], support: CgroupSupport) -> None:
    if not support.devices_enforced:
        pytest.skip(support.describe())
    opener = ("import sys\nfor path in sys.argv[1:]:\n  try:\n    open(path, 'rb').close()"
              "\n    print(path, 'ok')\n  except OSError as e:\n    print(path, e.errno)")
    paths = ["/dev/null", "/dev/urandom", "/dev/kmsg"]
    plain = make_job("job-plain", devices=("/dev/nvidia0",))  # absent here: skipped
    rc, out, _ = finish(spawn_in(plain, [sys.executable, "-c", opener, *paths]))
    assert rc == 0 and out.split("\n")[:3] == ["/dev/null ok", "/dev/urandom ok", "/dev/kmsg 1"]
    kmsg = make_job("job-kmsg", devices=("/dev/kmsg",))
    rc, out, _ = finish(spawn_in(kmsg, [sys.executable, "-c", opener, *paths]))
    assert rc == 0 and "/dev/kmsg ok" in out
    with pytest.raises(CgroupError, match="does not exist"):
        make_job("job-bad", devices=("/dev/no-such-device",))


def test_sweep_stale_kills_and_removes(support: CgroupSupport, base: str) -> None:
    jobs = [JobCgroups.create(support, base, f"old-g{i}", JobLimits(pids_max=5))
            for i in range(2)]
    procs = [spawn_in(j, ["sleep", "30"]) for j in jobs]
    try:
        wait_for(lambda: all(len(j.pids()) == 1 for j in jobs))
        assert sweep_stale(support, base) == ["old-g0", "old-g1"]
        assert not any(os.path.exists(f) for j in jobs for f in j.procs_files)
    finally:
        codes = [finish(p)[0] for p in procs]
    assert codes == [-9, -9]
    assert sweep_stale(support, base) == []


def test_names_are_one_component(support: CgroupSupport, base: str) -> None:
    for bad in ("../x", "a/b", "", ".", "..", "x y"):
        with pytest.raises(CgroupError, match="bad cgroup name"):
            JobCgroups.create(support, base, bad, JobLimits())
    with pytest.raises(ValueError):
        JobLimits(memory_bytes=0)


def test_an_existing_cgroup_is_not_reused(make_job: Callable[..., JobCgroups]) -> None:
    make_job("job-g2")
    with pytest.raises(CgroupError, match="exists"):
        make_job("job-g2")


# --- cgroup v2, on a plain folder laid out like a cgroup2 mount ----------------------------

def fake_v2(tmp_path: Path, agent_cg: str) -> tuple[Path, Path, Path]:
    mnt = tmp_path / "cg2"
    agent = mnt / "agent.slice"
    agent.mkdir(parents=True)
    (mnt / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (agent / "cgroup.controllers").write_text("cpuset cpu memory pids\n")
    (agent / "cgroup.type").write_text("domain\n")
    (agent / "cgroup.procs").write_text("4242\n")
    (agent / "cgroup.subtree_control").write_text("")
    self_cg, mountinfo = tmp_path / "self-cgroup", tmp_path / "mountinfo"
    self_cg.write_text(f"0::/outer{agent_cg}\n")
    # a container-style mount: the mount's root is the cgroup /outer
    mountinfo.write_text(f"41 31 0:38 /outer {mnt} rw,relatime - cgroup2 cgroup2 rw\n")
    return agent, self_cg, mountinfo


def test_v2_probe_and_layout_on_a_fake_tree(tmp_path: Path) -> None:
    agent, self_cg, mountinfo = fake_v2(tmp_path, "/agent.slice")
    found = probe(str(self_cg), str(mountinfo))
    assert isinstance(found, CgroupSupport), found
    assert (found.version, found.controllers, found.devices_enforced) == (
        2, frozenset({"cpuset", "memory", "pids"}), False)
    assert found.agent_dirs == (("unified", str(agent)),)
    assert "devices not enforced" in found.describe()

    job = JobCgroups.create(found, "sia-agent-n1", "job-g3",
                            JobLimits(memory_bytes=64 * MiB, pids_max=20, cpus=(0, 1)))
    jobdir = agent / "sia-jobs" / "sia-agent-n1" / "job-g3"
    assert job.procs_files == (str(jobdir / "cgroup.procs"),)
    assert (jobdir / "memory.max").read_text() == str(64 * MiB)
    assert (jobdir / "pids.max").read_text() == "20"
    assert (jobdir / "cpuset.cpus").read_text() == "0,1"
    # the agent's processes went to a leaf before its subtree_control was written
    assert (agent / "agent" / "cgroup.procs").read_text().startswith("4242")
    for d in (agent, agent / "sia-jobs", agent / "sia-jobs" / "sia-agent-n1"):
        assert (d / "cgroup.subtree_control").read_text() == "+cpuset +memory +pids"

    # Once moved, the agent finds itself in .../agent: its cgroup is still the parent.
    self_cg.write_text("0::/outer/agent.slice/agent\n")
    again = probe(str(self_cg), str(mountinfo))
    assert isinstance(again, CgroupSupport) and again.agent_dirs == found.agent_dirs


def test_v2_probe_reasons(tmp_path: Path) -> None:
    agent, self_cg, mountinfo = fake_v2(tmp_path, "/agent.slice")
    (agent / "cgroup.controllers").write_text("cpu pids\n")
    reason = probe(str(self_cg), str(mountinfo))
    assert isinstance(reason, str) and "memory controller" in reason
    self_cg.write_text("0::/elsewhere\n")
    reason = probe(str(self_cg), str(mountinfo))
    assert isinstance(reason, str) and "not mounted" in reason
    mountinfo.write_text(mountinfo.read_text().replace("rw,relatime", "ro,relatime"))
    self_cg.write_text("0::/outer/agent.slice\n")
    reason = probe(str(self_cg), str(mountinfo))
    assert isinstance(reason, str) and "read-only" in reason
