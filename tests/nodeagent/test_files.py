"""A job's folders are the job's: anything in them may be a link its code put there
to make the agent (root) chown, chmod or remove something else. The rule: the
agent changes only what is the job's, never through a link (`isolation.files`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sia_grpc.nodeagent.isolation.files import JobFolders, chown_tree, private_dir, remove_owned

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="chown to another uid needs root")
JOB_UID = 64123  # a uid no account here has


def _victim(tmp_path: Path) -> Path:
    """A folder the job must not touch, with a file in it."""
    v = tmp_path / "victim"
    v.mkdir(mode=0o755)
    (v / "secret").write_text("agent's")
    os.chmod(v / "secret", 0o600)
    return v


def _unchanged(v: Path) -> None:
    assert stat.S_IMODE(v.stat().st_mode) == 0o755
    for p in (v, v / "secret"):
        assert (p.stat().st_uid, p.stat().st_gid) == (os.geteuid(), os.getegid())
    assert (v / "secret").read_text() == "agent's"


@needs_root
def test_a_link_in_place_of_a_jobs_folder_is_replaced_not_followed(tmp_path):
    victim = _victim(tmp_path)
    folders = JobFolders(tmp_path / "run")
    ckpt = tmp_path / "ckpt" / "t" / "job"
    run = folders.prepare("t/job", JOB_UID, JOB_UID, ckpt)
    # The job (owner of its run folder) swaps its tmp for a link, and a file for shm.
    (run / "tmp").rmdir()
    (run / "tmp").symlink_to(victim)
    (run / "shm").rmdir()
    (run / "shm").write_text("x")
    (run / "escape").symlink_to(victim / "secret")
    os.chown(run / "escape", JOB_UID, JOB_UID, follow_symlinks=False)
    # A later run of the job (a resize, a profiling pass) prepares again, and the
    # agent hands the run folder to another owner (as a new uid would make it).
    folders.prepare("t/job", JOB_UID + 1, JOB_UID + 1, ckpt)
    _unchanged(victim)
    for sub in ("tmp", "shm"):
        st = os.lstat(run / sub)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == JOB_UID + 1


@needs_root
def test_chown_tree_never_follows_a_link_and_leaves_a_linked_top_alone(tmp_path):
    victim = _victim(tmp_path)
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "f").write_text("job's")
    (tree / "a" / "to-dir").symlink_to(victim)
    (tree / "to-file").symlink_to(victim / "secret")
    chown_tree(tree, JOB_UID, JOB_UID)
    _unchanged(victim)
    assert (tree / "a" / "f").stat().st_uid == JOB_UID
    assert os.lstat(tree / "to-file").st_uid == JOB_UID
    link = tmp_path / "link"
    link.symlink_to(victim)
    chown_tree(link, JOB_UID, JOB_UID)
    _unchanged(victim)


def test_private_dir_makes_the_folder_and_sets_its_mode(tmp_path):
    private_dir(tmp_path / "d", None, None)
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o700
    (tmp_path / "d2").symlink_to(tmp_path / "d")
    private_dir(tmp_path / "d2", None, None, mode=0o711)
    assert not (tmp_path / "d2").is_symlink()
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o700  # the target: as it was


def test_a_long_run_root_puts_the_sockets_under_a_random_folder_of_the_agents(tmp_path):
    folders = JobFolders(tmp_path / ("r" * 90))
    sock = folders.socket_dir("tenant/" + "u" * 32)
    root = sock.parent
    assert root.parent == Path("/tmp") and root.name.startswith("sia-sock-")
    assert root.name != "sia-sock-" and (root.stat().st_uid, stat.S_IMODE(root.stat().st_mode)) \
        == (os.geteuid(), 0o711)
    assert folders.socket_dir("tenant/" + "u" * 32) == sock  # stable for the agent's life
    folders.close()
    assert not root.exists()


@needs_root
def test_what_a_freed_uid_left_in_scratch_folders_is_removed_and_nothing_else(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "shared").mkdir(parents=True, mode=0o1777)
    mine = [scratch / "f", scratch / "d", scratch / "d" / "g", scratch / "shared" / "h",
            scratch / "link"]
    (scratch / "d").mkdir()
    for f in (scratch / "f", scratch / "d" / "g", scratch / "shared" / "h"):
        f.write_text("job's")
    victim = _victim(tmp_path)
    (scratch / "link").symlink_to(victim)
    for p in mine:
        os.chown(p, JOB_UID, JOB_UID, follow_symlinks=False)
    (scratch / "others").write_text("someone else's")
    # The entries at the top it owns, with what is under them (not "shared/h": in
    # another's folder, which would take a walk of the whole tree).
    assert remove_owned(JOB_UID, (str(scratch),)) == 3
    assert sorted(p.name for p in scratch.iterdir()) == ["others", "shared"]
    _unchanged(victim)


def test_the_sandbox_never_binds_the_folder_the_agent_started_in_or_the_root(monkeypatch):
    """Defect: under `python -m` sys.path[0] is the agent's cwd; started from `/`, the
    sandbox bound the whole host."""
    import sys

    from sia_grpc.nodeagent.isolation.sandbox import python_paths

    monkeypatch.setattr(sys, "path", ["/", "/srv/somewhere-else", *sys.path[1:], "/"])
    paths = python_paths()
    assert "/" not in paths and paths  # the prefixes are still there
    assert not any(p == "/srv/somewhere-else" for p in paths)  # (not a folder here)


@needs_root
def test_handing_back_takes_only_what_the_freed_uid_owns(tmp_path):
    """A job moved on (another agent here, or shared storage) owns its checkpoint
    folder under a new uid: the old agent's late hand-back must not take it."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "old").write_text("x")
    (ckpt / "sub" / "new").write_text("y")
    os.chown(ckpt / "old", JOB_UID, JOB_UID)
    for p in (ckpt, ckpt / "sub", ckpt / "sub" / "new"):
        os.chown(p, JOB_UID + 1, JOB_UID + 1)
    chown_tree(ckpt, 0, 0, owned_by=JOB_UID)
    assert (ckpt / "old").stat().st_uid == 0
    assert {p.stat().st_uid for p in (ckpt, ckpt / "sub", ckpt / "sub" / "new")} == {JOB_UID + 1}
