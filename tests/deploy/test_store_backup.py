"""The backup and restore procedure of docs/operations.md, on a live store written by
sia_grpc/controller/stores/: an online backup taken while the store is open (WAL
mode, transactions not yet checkpointed) is a consistent snapshot, and restoring it
(controller stopped; the database, -wal and -shm moved aside together; the backup
copied in) gives back exactly the jobs it held, in a store that keeps working.
Also shows why the docs say `.backup` and never `.dump`."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sia_grpc.api import pb
from sia_grpc.controller.stores import SqliteStore as Store
from sia_grpc.controller.stores import StoreError

# The Python form of the backup in docs/operations.md (for hosts without sqlite3).
PY_BACKUP = ("import sqlite3, sys; src = sqlite3.connect(sys.argv[1]); "
             "dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close(); src.close()")


def job(i: int) -> pb.Job:
    spec = pb.JobSpec(name=f"job-{i}", application="cifar10",
                      adaptivity=pb.ADAPTIVITY_ADAPTIVE, tenant=f"team-{i % 3}")
    return pb.Job(job_id=f"job-{i}", spec=spec, status=pb.JobStatus(state=pb.JOB_STATE_QUEUED))


def backup(method: str, db: Path, dest: Path) -> None:
    if method == "sqlite3":
        tool = shutil.which("sqlite3")
        if tool is None:
            pytest.skip("the sqlite3 command-line tool is not installed")
        # sqlite3 /var/lib/sia/sia.db ".backup /var/lib/sia/backups/sia-....db"
        subprocess.run([tool, str(db), f".backup {dest}"], check=True, timeout=30)
    else:
        subprocess.run([sys.executable, "-c", PY_BACKUP, str(db), str(dest)], check=True,
                       timeout=30)


@pytest.mark.parametrize("method", ["sqlite3", "python"])
def test_online_backup_and_restore(tmp_path: Path, method: str) -> None:
    state = tmp_path / "var-lib-sia"
    state.mkdir()
    db = state / "sia.db"
    live = Store(db)  # the running controller
    created = [j for j, _ in live.create_jobs([(job(i), f"req-{i}") for i in range(40)])]
    done = pb.Job()
    done.CopyFrom(created[0])
    done.status.state = pb.JOB_STATE_RUNNING
    live.put_jobs([(done, b"estimator-state")])
    assert Path(f"{db}-wal").stat().st_size > 0  # committed, not yet checkpointed
    revision = live.revision
    expected = {s.job.job_id: s.job for s in live.all_jobs()}

    (state / "backups").mkdir()
    dest = state / "backups" / "sia-20261130T120000.db"
    backup(method, db, dest)
    live.create_jobs([(job(99), "")])  # written after the backup: not in it

    check = sqlite3.connect(dest)
    assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert check.execute("SELECT count(*) FROM jobs").fetchone() == (40,)
    check.close()

    # Restore: stop the controller, move the database and its -wal/-shm aside
    # together, copy the backup in, start the controller.
    live.close()
    aside = state / "replaced"
    aside.mkdir()
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{db}{suffix}").exists():
            Path(f"{db}{suffix}").rename(aside / f"sia.db{suffix}")
    shutil.copy2(dest, db)
    with Store(db) as restored:
        jobs = {s.job.job_id: s for s in restored.all_jobs()}
        assert {k: v.job for k, v in jobs.items()} == expected
        assert jobs["job-0"].extra == b"estimator-state"
        assert jobs["job-0"].job.status.state == pb.JOB_STATE_RUNNING
        assert restored.revision == revision
        # Changes the backup holds resume for WatchJobs clients, and it accepts writes.
        assert [r for r, _, _ in restored.events_since(revision - 1)] == [revision]
        ((new, fresh),) = restored.create_jobs([(job(100), "")])
        assert fresh and new.revision == revision + 1


def test_a_dump_is_not_a_backup(tmp_path: Path) -> None:
    """`.dump` drops PRAGMA user_version (the store's schema version): a store
    restored from it cannot be opened."""
    tool = shutil.which("sqlite3")
    if tool is None:
        pytest.skip("the sqlite3 command-line tool is not installed")
    db = tmp_path / "sia.db"
    with Store(db) as live:
        live.create_jobs([(job(1), "")])
        dump = subprocess.run([tool, str(db), ".dump"], check=True, capture_output=True,
                              text=True, timeout=30).stdout
    restored = tmp_path / "from-dump.db"
    subprocess.run([tool, str(restored)], input=dump, check=True, text=True, timeout=30)
    with pytest.raises(StoreError):
        Store(restored)
