"""The bridge against a real Slurm (sia_grpc/testing/slurm.py: slurmctld and three
slurmd on this machine, rtx-0 and rtx-1 with 4 rtx GPUs each, a100-0 with 4 a100,
which the bridge maps onto the profiles' dgx-ext). Skips, saying why, where Slurm
cannot run (`make venv` installs Debian's slurm-wlm as root)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import pytest
import slurm_live as live

from sia_grpc.cli import main as sia
from sia_grpc.slurm.bridge import Bridge, in_process_optimizer
from sia_grpc.slurm.reports import ReportServer
from sia_grpc.slurm.translate import (
    Action,
    Shape,
    build_round,
    read_jobs,
    read_nodes,
)

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(120)]

def test_opted_in_jobs_run_where_sia_put_them_and_slurms_own_jobs_are_left_alone(
        cluster, slurm, capsys, tmp_path):
    own = live.own_job(slurm, "gpu:rtx:3")
    ours = [live.submit(capsys, tmp_path, f"j{i}") for i in range(3)]
    before = live.wait(slurm, lambda js: js[own].state == "RUNNING", "Slurm's own job running")
    assert all(before[i].held and before[i].ticket.shape is None for i in ours)

    report = live.bridge(slurm).round()
    assert not report.failed
    assert sorted(a.job_id for a in report.actions) == ours  # nothing done to `own`
    jobs = live.wait(slurm, live.all_run, "every job running")
    live.running_as_decided(jobs, report, cluster)
    assert jobs[own].raw["comment"] == "" and jobs[own].state == "RUNNING"
    assert dict(jobs[own].gpus) == dict(before[own].gpus)
    # Sia planned only on the GPUs Slurm's own job left free on its node.
    (node,) = before[own].gpus
    planned = sum(g.node == node for d in report.response.decisions for g in d.allocation.gpus)
    assert planned <= 4 - before[own].gpus[node]

    # A new bridge (a restart) reads the same state from Slurm: it changes nothing.
    again = live.bridge(slurm).round()
    assert again.actions == [] and again.failed == []
    after = live.jobs(slurm)
    assert {i: (j.state, j.raw["comment"]) for i, j in after.items()} == {
        i: (j.state, j.raw["comment"]) for i, j in jobs.items()}


def test_a_node_drained_in_slurm_is_left_out_and_its_jobs_move(cluster, slurm, capsys,
                                                                tmp_path):
    ours = [live.submit(capsys, tmp_path, f"d{i}") for i in range(2)]
    first = live.bridge(slurm).round()
    assert sorted(a.job_id for a in first.actions) == ours
    jobs = live.wait(slurm, live.all_run, "the jobs running")
    busy = sorted({n for i in ours for n in jobs[i].gpus})
    drained = busy[0]
    cluster.run("scontrol", "update", f"nodename={drained}", "state=drain", "reason=test")

    report = live.bridge(slurm).round()
    assert drained in report.left_out
    moved = [a for a in report.actions if a.kind == "move"]
    assert moved and not report.failed
    jobs = live.wait(slurm, lambda js: live.all_run(js) and set(report.moved.values()) <= set(js),
                 "the moved jobs running")
    assert not any(drained in j.gpus for j in jobs.values())
    for old, new in report.moved.items():
        assert old not in jobs  # the old copy was cancelled
        assert jobs[new].ticket.moves == 1
    live.running_as_decided(jobs, report, cluster)
    assert json.loads(jobs[report.moved[moved[0].job_id]].raw["comment"][5:])["id"] == str(
        moved[0].job_id)  # the sia id stays the first Slurm id

    assert live.bridge(slurm).round().actions == []  # settled


def _epochs(path) -> list[tuple[int, float]]:
    """(epoch, progress) of each line the mlp example printed."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else ():
        if line.startswith("epoch "):
            words = line.split()
            out.append((int(words[1].rstrip(":")), float(words[-1])))
    return out


@pytest.mark.slow  # two starts of torch in Slurm jobs: ~20 s, most of it importing
def test_a_moved_training_job_resumes_from_its_checkpoint_with_what_it_reported(
        cluster, slurm, capsys, tmp_path):
    pytest.importorskip("torch")
    token = tmp_path / "token"
    token.write_text("w0rkers\n")
    reports = ReportServer("127.0.0.1:0", "w0rkers")
    bridge = Bridge(slurm, in_process_optimizer(), reports=reports)
    try:
        first, log0, report = _train_and_move(cluster, slurm, capsys, tmp_path, bridge,
                                              f"127.0.0.1:{reports.port}", token)
    finally:
        reports.stop()
    new = report.moved[first]
    # What the workers reported went into the ticket, and with it to the copy: a
    # restarted bridge (nothing in memory) plans with it.
    copy = live.jobs(slurm)[new].ticket
    assert copy.grad is not None and copy.obs and copy.moves == 1
    rnd = build_round(read_nodes(slurm.nodes_json())[0], read_jobs(slurm.jobs_json()), 0.0)
    (planned,) = rnd.request.jobs
    assert (planned.grad.sqr, planned.grad.var) == copy.grad
    assert {(o[0], o[3], o[5]) for o in copy.obs} <= {
        (s.gpu_type, s.atomic_batch_size, s.count) for s in planned.samples}

    # (two starts of torch and the training: longer than a state change)
    live.wait(slurm, lambda js: first not in js and new not in js, "the moved job to finish",
          wait_s=3 * live.WAIT_S)
    before, after = _epochs(log0), _epochs(tmp_path / f"slurm-{new}.out")
    assert before and after and after[-1][0] == 15 and after[-1][1] == 1.0
    # Resumed where the checkpoint (on SIGTERM) left it: not from the start, no epoch skipped.
    # A SIGTERM seen at the last step of an epoch checkpoints the epoch as done before the
    # example prints its line, so the copy may start one epoch after the next printed one.
    assert 0 < after[0][0] <= before[-1][0] + 2 and after[0][1] >= before[-1][1]
    assert "Traceback" not in log0.read_text()


@pytest.mark.slow  # a start of torch in a Slurm job: ~10 s, most of it importing
def test_a_batch_change_on_the_same_gpus_reaches_the_running_workers_without_a_move(
        cluster, slurm, capsys, tmp_path):
    pytest.importorskip("torch")
    token = tmp_path / "token"
    token.write_text("w0rkers\n")
    reports = ReportServer("127.0.0.1:0", "w0rkers")
    halve = False

    def optimize(request):
        # The policy, then (once the job runs) half its batch on the same GPUs: as
        # Sia does when a job's statistics change (a smaller batch, more efficient).
        response = in_process_optimizer()(request)
        for d in response.decisions if halve else ():
            a = d.allocation
            a.atomic_batch_size, a.accum_steps = a.atomic_batch_size // 2, 0
            a.batch_size = a.atomic_batch_size * a.num_replicas
        return response

    bridge = Bridge(slurm, optimize, reports=reports)
    try:
        job = _submit_mlp(capsys, tmp_path, f"127.0.0.1:{reports.port}", token)
        (start,) = bridge.round().actions
        log = tmp_path / f"slurm-{job}.out"
        deadline = time.monotonic() + 3 * live.WAIT_S  # (torch starting in the job)
        while reports.received < 2:
            assert time.monotonic() < deadline, f"no reports: {log.read_text()}"
            time.sleep(0.1)
        halve = True
        report = bridge.round()
        (rebatch,) = report.actions
        assert rebatch.kind == "rebatch" and rebatch.job_id == job and not report.moved
        new = rebatch.ticket.shape
        assert new.same_place(start.ticket.shape) and new.batch != start.ticket.shape.batch
        # The workers took the new batch at a step, in the same Slurm job: nothing
        # restarted, and the ticket (what a copy would start with) holds it.
        while f"batch {new.batch_size} " not in log.read_text():  # (its epoch lines)
            assert time.monotonic() < deadline, f"no batch change: {log.read_text()}"
            time.sleep(0.1)
        jobs = live.jobs(slurm)
        assert list(jobs) == [job] and jobs[job].state == "RUNNING"
        assert jobs[job].ticket.shape == new and jobs[job].ticket.moves == 0
        # The next round starts from the new batch (Sia may change it again as the
        # job's statistics move, in place: never a move for it).
        again = bridge.round()
        assert {a.kind for a in again.actions} <= {"rebatch"}
        assert f"batch {new.batch_size}→" in again.response.decisions[0].reason or (
            not again.actions)
    finally:
        reports.stop()


def _submit_mlp(capsys, tmp_path, report_to: str, token, *options: str) -> int:
    """`sia slurm submit` the mlp example (16 epochs of 32,768 samples) reporting to
    `report_to` every 0.2 s: its Slurm id."""
    spec = tmp_path / "mlp.yaml"
    spec.write_text(f"name: mlp\n{live.SPEC}epochs: 16\n")
    capsys.readouterr()
    assert sia(["slurm", "submit", *options, "--report-to", report_to,
                "--report-token-file", str(token), str(spec), "--", "env",
                "SIA_REPORT_INTERVAL_S=0.2", sys.executable, "-m",
                "sia_grpc.train.examples.mlp", "--samples", "32768"]) == 0
    return int(capsys.readouterr().out.strip())


def _train_and_move(cluster, slurm, capsys, tmp_path, bridge, report_to, token):
    """Submit the mlp example reporting to `report_to`, start it, let it train and
    report, drain its node and run a round: (its Slurm id, its log, the round). (32,768
    samples an epoch: with 4,096, an idle machine trained all 16 epochs before the round,
    and the move found nothing to checkpoint.)"""
    first = _submit_mlp(capsys, tmp_path, report_to, token,
                        "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert bridge.round().actions[0].kind == "start"
    log0 = tmp_path / f"slurm-{first}.out"
    deadline = time.monotonic() + 3 * live.WAIT_S  # (torch starting in the job)
    # Trained a little (there is something to lose) and reported.
    while not _epochs(log0) or bridge.reports.received < 2:
        assert time.monotonic() < deadline, f"no epochs or reports: {log0.read_text()}"
        time.sleep(0.1)
    (node,) = live.jobs(slurm)[first].gpus
    cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
    report = bridge.round()
    assert first in report.moved, "the job finished before the bridge moved it"
    return first, log0, report


def test_jobs_an_operator_starts_or_holds_by_hand_are_left_alone(cluster, slurm, capsys,
                                                                  tmp_path):
    by_hand, held = live.submit(capsys, tmp_path, "hand"), live.submit(capsys, tmp_path, "hold")
    # docs/slurm.md, "If the bridge stops": give it GPUs and release it.
    slurm.run("scontrol", "update", f"job={by_hand}", "TresPerJob=gres:gpu:rtx:2",
              "NumNodes=1-1", "NumTasks=1")
    slurm.run("scontrol", "release", str(by_hand))
    slurm.run("scontrol", "hold", str(held))  # as root: an operator's hold
    live.wait(slurm, lambda js: js[by_hand].state == "RUNNING" and js[held].admin_held,
          "the job started by hand running, the other held by the operator")
    report = live.bridge(slurm).round()
    assert report.actions == [] and report.failed == []
    jobs = live.jobs(slurm)
    assert jobs[by_hand].state == "RUNNING" and jobs[held].admin_held


def test_starts_and_copies_run_on_the_nodes_sia_pinned_them_to(cluster, slurm, capsys,
                                                                tmp_path):
    # Left a type and a count, Slurm starts a one-GPU job on the first rtx node with
    # room; pinned, it starts where Sia placed it, and a copy waits for its pinned
    # node (taken here by Slurm's own job) until the bridge pins it elsewhere.
    job = live.submit(capsys, tmp_path, "pinned")
    ticket = live.jobs(slurm)[job].ticket
    one_on = {n: Shape("rtx", "rtx", 1, 1, 64, 64, 0, 1, nodes=((n, 1),))
              for n in ("rtx-0", "rtx-1")}
    slurm.apply(Action("start", job, dataclasses.replace(ticket, shape=one_on["rtx-1"])))
    jobs = live.wait(slurm, lambda js: js[job].state == "RUNNING", "the job running")
    assert dict(jobs[job].gpus) == {"rtx-1": 1}
    own = live.own_job(slurm, "gpu:rtx:4")
    live.wait(slurm, lambda js: dict(js[own].gpus) == {"rtx-0": 4}, "Slurm's own job on rtx-0")
    copy = slurm.apply(Action("move", job, dataclasses.replace(
        jobs[job].ticket, shape=one_on["rtx-0"], moves=1)), jobs[job].raw)
    assert copy is not None
    time.sleep(2.0)  # (slurmctld's scheduling passes: once a second)
    jobs = live.jobs(slurm)
    assert jobs[copy].state == "PENDING" and not jobs[copy].gpus  # rtx-1 free, not its node
    slurm.apply(Action("pin", copy, dataclasses.replace(jobs[copy].ticket,
                                                        shape=one_on["rtx-1"])))
    jobs = live.wait(slurm, lambda js: js[copy].state == "RUNNING", "the copy running, re-pinned")
    assert dict(jobs[copy].gpus) == {"rtx-1": 1}
    assert jobs[copy].ticket.shape.nodes == (("rtx-1", 1),)


def test_a_job_and_its_copies_start_with_the_submitters_environment_only(
        cluster, slurm, capsys, tmp_path, monkeypatch):
    # The bridge's environment must not reach a user's job, and a copy must start as
    # the job did: sbatch --export=ALL from a bare environment, the job's own written
    # into its script (not --export=NONE, with which slurmd loaded the user's login
    # environment before every start: a second or more of each move on the bench).
    monkeypatch.setenv("HOME", str(tmp_path / "submitter"))
    spec = tmp_path / "env.yaml"
    spec.write_text(f"name: env\n{live.SPEC}")
    capsys.readouterr()
    assert sia(["slurm", "submit", str(spec), "--", "sh", "-c", "env; exec sleep 300"]) == 0
    first = int(capsys.readouterr().out.strip())
    monkeypatch.setenv("HOME", "/the/bridge")
    monkeypatch.setenv("SIA_BRIDGE_ONLY", "1")
    assert [a.kind for a in live.bridge(slurm).round().actions] == ["start"]
    (node,) = live.wait(slurm, live.all_run, "the job running")[first].gpus
    envs = [_printed_env(tmp_path / f"slurm-{first}.out")]
    cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
    new = live.bridge(slurm).round().moved[first]
    envs.append(_printed_env(tmp_path / f"slurm-{new}.out"))
    for job, env in zip((first, new), envs, strict=True):
        assert env["HOME"] == str(tmp_path / "submitter") and "SIA_BRIDGE_ONLY" not in env
        assert env["SIA_JOB_ID"] == str(first) and env["SLURM_JOB_ID"] == str(job)


def _printed_env(out) -> dict[str, str]:
    """The environment a job printed (`env`) into its output file, once it has."""
    deadline = time.monotonic() + live.WAIT_S
    while "SIA_JOB_ID=" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline, f"{out.name}: no environment printed"
        time.sleep(0.1)
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
