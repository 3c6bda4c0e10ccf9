"""The bridge's moves against a real Slurm (conftest.py's cluster): a move's two halves
(the copy submitted, then the old job cancelled), what happens between them, and a
job that ends before its move."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest
import slurm_live as live

from sia_grpc.cli import main as sia
from sia_grpc.slurm.commands import JobEnded, Slurm
from sia_grpc.slurm.translate import Action

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(120)]


def test_a_job_that_ended_since_the_round_read_it_is_not_moved(cluster, slurm, capsys,
                                                                tmp_path):
    # A round reads the queue, decides, then acts: a job that finishes in between was
    # copied, and the copy started from its final checkpoint and ended at once,
    # holding GPUs meanwhile. A move now looks at the job first.
    spec = tmp_path / "quick.yaml"
    spec.write_text(f"name: quick\n{live.SPEC}")
    capsys.readouterr()
    assert sia(["slurm", "submit", str(spec), "--", "true"]) == 0
    job_id = int(capsys.readouterr().out.strip())
    (start,) = live.bridge(slurm).round().actions
    deadline = time.monotonic() + live.WAIT_S
    while slurm.state(job_id) not in ("COMPLETED", None):
        assert time.monotonic() < deadline, f"job {job_id} did not finish"
        time.sleep(0.2)
    move = Action("move", job_id, dataclasses.replace(start.ticket, shape=None, moves=1))
    with pytest.raises(JobEnded, match="not moved"):
        slurm.apply(move, {})
    assert max(int(j["job_id"]) for j in slurm.jobs_json()["jobs"]) == job_id  # no copy


class _MidMove(Slurm):
    """Slurm, with something done by someone else right after the bridge submits a
    move's copy and before it cancels the old job (`meanwhile(action, new)`)."""

    def __init__(self, meanwhile: Callable[[Action, int], None]) -> None:
        super().__init__()
        self.meanwhile = meanwhile

    def copy(self, action, raw=None) -> int:
        new = super().copy(action, raw)
        self.meanwhile(action, new)
        return new


def _running_then_moved(cluster, slurm, capsys, tmp_path, meanwhile):
    """A job started by the bridge, then its node drained and a round run with
    `meanwhile` between the move's halves: (the job's first Slurm id, the round)."""
    job = live.submit(capsys, tmp_path, "mid")
    assert [a.kind for a in live.bridge(slurm).round().actions] == ["start"]
    (node,) = live.wait(slurm, live.all_run, "the job running")[job].gpus
    cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
    return job, live.bridge(_MidMove(meanwhile)).round()


def test_a_job_its_owner_cancels_mid_move_stays_cancelled_its_copy_too(
        cluster, slurm, capsys, tmp_path):
    # The owner's scancel lands between the copy's sbatch and the bridge's scancel of
    # the old job (which succeeds silently on an ended job): the copy would have run
    # the job the owner cancelled. The bridge reads the old job's state first.
    def owner_cancels_the_old(action, new):
        slurm.cancel(action.job_id)

    job, report = _running_then_moved(cluster, slurm, capsys, tmp_path, owner_cancels_the_old)
    (skipped,) = report.skipped
    assert skipped.job_id == job and not report.moved and not report.failed
    live.wait(slurm, lambda js: not live.live_in(js) and slurm.state(job) == "CANCELLED",
          "the job cancelled, no copy of it left")
    assert live.bridge(slurm).round().actions == []


def test_a_copy_its_owner_cancels_mid_move_ends_the_job_as_cancelled(
        cluster, slurm, capsys, tmp_path):
    def owner_cancels_the_copy(action, new):
        slurm.cancel(new)

    job, report = _running_then_moved(cluster, slurm, capsys, tmp_path, owner_cancels_the_copy)
    new = report.moved[job]
    live.wait(slurm, lambda js: not live.live_in(js) and (slurm.state(job), slurm.state(new)) == (
        "CANCELLED", "CANCELLED"), "both copies cancelled")
    assert live.bridge(slurm).round().actions == []


def test_the_gpus_a_copy_was_moved_to_going_down_mid_move_it_is_placed_again(
        cluster, slurm, capsys, tmp_path):
    # Every node of the GPU type the copy asks for goes down between the two halves
    # (and the drain that caused the move ends): the copy cannot start there, the
    # next rounds place it on what is left, and at no moment do two copies of the
    # job hold GPUs.
    down: list[str] = []

    def its_type_goes_down(action, new):
        gres = action.ticket.shape.gres_type
        for n, (t, _) in cluster.nodes.items():
            if t == gres:
                down.append(n)
                cluster.run("scontrol", "update", f"nodename={n}", "state=down", "reason=test")
            else:
                cluster.run("scontrol", "update", f"nodename={n}", "state=resume", check=False)

    job, report = _running_then_moved(cluster, slurm, capsys, tmp_path, its_type_goes_down)
    assert job in report.moved and down
    deadline = time.monotonic() + 3 * live.WAIT_S
    while True:
        jobs = live.live_in(live.jobs(slurm))
        holding = [j for j in jobs.values() if j.gpus]
        assert len(holding) <= 1, f"two copies hold GPUs: {holding}"
        if holding and holding[0].state == "RUNNING" and len(jobs) == 1:
            break
        assert time.monotonic() < deadline, f"not placed again: {list(jobs.values())}"
        live.bridge(slurm).round()
        time.sleep(0.5)
    assert not set(holding[0].gpus) & set(down)
    assert holding[0].ticket.id == str(job)


class _Recording(Slurm):
    """Slurm, noting the order of a move's two halves."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def copy(self, action, raw=None) -> int:
        self.calls.append(("copy", action.job_id))
        return super().copy(action, raw)

    def end_move(self, action, new) -> None:
        self.calls.append(("cancel", action.job_id))
        super().end_move(action, new)


def test_a_round_submits_every_copy_before_it_cancels_any_old_job(cluster, slurm, capsys,
                                                                   tmp_path):
    # slurmctld starts a pending job on its once-a-second pass, or at once when a job
    # ends: with every copy pending before the first old copy ends, that end starts
    # them all (docs/slurm.md, "Where a move's seconds go").
    ours = [live.submit(capsys, tmp_path, f"o{i}") for i in range(4)]
    assert sorted(a.job_id for a in live.bridge(slurm).round().actions) == ours
    jobs = live.wait(slurm, live.all_run, "the jobs running")
    for node in sorted({n for i in ours for n in jobs[i].gpus}):
        cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
    recording = _Recording()
    report = live.bridge(recording).round()
    kinds = [kind for kind, _ in recording.calls]
    assert kinds.count("copy") >= 2, recording.calls  # (every node they ran on drained)
    assert kinds == sorted(kinds, key=lambda k: k == "cancel"), recording.calls
    assert set(report.moved) == {job for kind, job in recording.calls if kind == "cancel"}
