"""`sia bench slurm`'s breakdown of a move's seconds (sia_grpc/bench/slurm_stages.py)
from Slurm's log lines as its daemons write them, the bridge's round and the
workers' moments: the stages follow each other and add up to the whole."""

from __future__ import annotations

from datetime import datetime

import pytest

from sia_grpc.bench.slurm_stages import MOVE_STAGES, SlurmLogMoments, breakdown, summary
from sia_grpc.slurm.bridge import RoundReport
from sia_grpc.slurm.translate import Action, Ticket

T0 = datetime.fromisoformat("2026-12-06T10:00:00").timestamp()  # (Slurm logs local time)


def _stamp(s: float) -> str:
    return datetime.fromtimestamp(T0 + s).isoformat(timespec="milliseconds")


@pytest.fixture
def logs(tmp_path):
    (tmp_path / "slurmctld.log").write_text("".join(f"[{_stamp(s)}] {line}\n" for s, line in (
        (0.0, "_slurm_rpc_submit_batch_job: JobId=8 InitPrio=4294901759 usec=1119"),
        (1.20, "sched: Allocate JobId=8 NodeList=rtx-0 #CPUs=1 Partition=gpu"),
        (1.90, "_job_complete: JobId=7 WEXITSTATUS 0"),
        (1.95, "_job_complete: JobId=7 done"),
        (2.00, "_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=5 uid 0"),
        (2.30, "sched: Allocate JobId=9 NodeList=rtx-1 #CPUs=1 Partition=gpu"))))
    (tmp_path / "rtx-0.log").write_text(f"[{_stamp(1.25)}] Launching batch job 8 for UID 0\n")
    (tmp_path / "rtx-1.log").write_text(f"[{_stamp(2.31)}] Launching batch job 9 for UID 0\n"
                                        f"[{_stamp(2.9)}] Launching batch job 9 for UID 0\n")
    return tmp_path


def test_slurms_log_lines_give_each_jobs_allocation_launch_and_end(logs):
    m = SlurmLogMoments(logs)
    assert m.allocated == pytest.approx({8: T0 + 1.2, 9: T0 + 2.3})
    assert m.launched == pytest.approx({8: T0 + 1.25, 9: T0 + 2.31})  # (the first launch)
    assert m.ended == pytest.approx({7: T0 + 1.95})  # (a cancelled job logs no "done")


def test_a_moves_stages_follow_each_other_and_add_up_to_the_whole(logs):
    # Job 5 (running) moves to copy 9; held job 8 starts. The round read Slurm at
    # 1.0 s, started the copy at 1.1 s and cancelled job 5 by 2.0 s.
    rnd = RoundReport(actions=[Action("start", 8), Action("move", 5)], moved={5: 9},
                      read_at=T0 + 0.9, applied={8: (T0 + 1.0, T0 + 1.05),
                                                 5: (T0 + 1.1, T0 + 2.0)})
    copies = {"5": {"stopped": T0 + 2.0, "exited": T0 + 2.2},
              "8": {"launched": T0 + 1.3, "main": T0 + 1.5, "ready": T0 + 1.51,
                    "first_report": T0 + 1.6},
              "9": {"launched": T0 + 2.35, "main": T0 + 2.6, "ready": T0 + 2.61,
                    "first_report": T0 + 3.0}}
    got = breakdown([rnd], copies, SlurmLogMoments(logs))
    (move,) = got["moves"]
    assert move["decided"] == pytest.approx(0.2) and move["commands"] == pytest.approx(0.9)
    assert move["old_exit"] == pytest.approx(0.2)
    # Copy 9 was allocated (2.3) after the old copy exited (2.2): the wait is
    # `allocated`'s; its slurmd launch at 2.31, the script at 2.35, Python at 2.6.
    assert move["old_ended"] == 0.0 and move["allocated"] == pytest.approx(0.1)
    assert move["python"] == pytest.approx(0.25)
    assert sum(move[s] for s in MOVE_STAGES) == pytest.approx(3.0 - 0.9)
    assert move["slurm_side"] == pytest.approx(2.6 - 1.1 - 0.0)  # commands .. python
    (start,) = got["starts"]
    assert start["allocated"] == pytest.approx(0.15)  # (scontrol release 1.05 .. 1.20)
    assert sum(start[s] for s in MOVE_STAGES if s in start) == pytest.approx(1.6 - 0.9)
    assert summary(got["moves"])["slurm_side"]["n"] == 1


def test_a_move_without_its_copys_moments_is_left_out(logs):
    rnd = RoundReport(actions=[Action("move", 5)], moved={5: 9}, read_at=T0,
                      applied={5: (T0 + 0.1, T0 + 0.2)})
    assert breakdown([rnd], {}, SlurmLogMoments(logs)) == {"moves": [], "starts": []}


def test_a_copy_slurm_started_on_another_node_than_sias_is_counted(logs):
    from sia_grpc.api import pb

    def round_planning(node: str) -> RoundReport:
        response = pb.OptimizeResponse(decisions=[pb.JobDecision(
            job_id="5", allocation=pb.Allocation(gpus=[pb.GpuRef(node=node, index=0)]))])
        return RoundReport(actions=[Action("move", 5, Ticket("5", {}, 0.0))], moved={5: 9},
                           read_at=T0 + 0.9, applied={5: (T0 + 1.1, T0 + 2.0)},
                           response=response)

    copies = {"5": {"exited": T0 + 2.2},
              "9": {"launched": T0 + 2.35, "main": T0 + 2.6, "ready": T0 + 2.61,
                    "first_report": T0 + 3.0}}
    moments = SlurmLogMoments(logs)
    assert moments.nodes == {8: "rtx-0", 9: "rtx-1"}
    (there,) = breakdown([round_planning("rtx-1")], copies, moments)["moves"]
    (other,) = breakdown([round_planning("rtx-0")], copies, moments)["moves"]
    assert (there["elsewhere"], other["elsewhere"]) == (0.0, 1.0)
    assert summary([there, other])["elsewhere"]["mean"] == 0.5
