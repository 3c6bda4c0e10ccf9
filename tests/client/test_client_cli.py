"""The controller commands, registered on a fresh parser with add_commands, and their
formatting functions."""

from __future__ import annotations

import argparse
import io
import json

import pytest
import yaml

from sia_grpc.api import pb
from sia_grpc.client import SiaClient
from sia_grpc.client import cli as client_cli


def sia(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="sia")
    client_cli.add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: resnet\napplication: cifar10\nadaptivity: adaptive\n"
                    "min_gpus: 1\nmax_gpus: 4\n")
    return path


def test_submit_prints_the_job_id(target, fake, spec_file, capsys):
    assert sia("submit", str(spec_file), "--id", "r1", "--controller", target) == 0
    assert capsys.readouterr().out == "r1\n"
    assert fake.jobs["r1"].spec.max_gpus == 4


@pytest.mark.parametrize("final,code", [(pb.JOB_STATE_SUCCEEDED, 0), (pb.JOB_STATE_FAILED, 1)])
def test_submit_wait_follows_to_the_final_state(target, fake, spec_file, capsys, final, code):
    def finish():
        fake.set_state("r1", pb.JOB_STATE_RUNNING, gpus=4)
        fake.set_state("r1", final)

    fake.on_watch = finish  # once the CLI follows the job, it runs and finishes
    rc = sia("submit", str(spec_file), "--id", "r1", "--wait", "--controller", target)
    lines = capsys.readouterr().out.splitlines()
    assert rc == code
    assert lines[0] == "r1" and "r1 RUNNING 4×rtx" in lines
    assert lines[-1].startswith(f"r1 {pb.JobState.Name(final).removeprefix('JOB_STATE_')}")


def test_ls_table(target, fake, capsys):
    a, b = fake.add("resnet"), fake.add("bert", tenant="nlp")
    fake.set_state(a.job_id, pb.JOB_STATE_RUNNING, gpus=4, progress=0.25, restarts=2,
                   reason="grew to 4 GPUs")
    assert sia("ls", "--controller", target) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATE", "GPUS", "BATCH", "PROGRESS",
                                "RESTARTS", "REASON"]
    assert lines[1].split() == [a.job_id, "resnet", "RUNNING", "4×rtx", "256", "25%", "2",
                                "grew", "to", "4", "GPUs"]
    assert lines[2].split() == [b.job_id, "bert", "QUEUED", "-", "-", "0%", "0"]

    assert sia("ls", "--state", "queued", "--tenant", "nlp", "--controller", target) == 0
    assert [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:]] == [b.job_id]
    assert sia("ls", "--state", "failed", "--controller", target) == 0
    assert capsys.readouterr().out == "no jobs\n"


def test_ls_rejects_an_unknown_state(capsys):
    with pytest.raises(SystemExit) as exit_:
        sia("ls", "--state", "sleeping")
    assert exit_.value.code == 2 and "unknown state 'sleeping'" in capsys.readouterr().err


def test_get_yaml_and_json(target, fake, capsys, tmp_path):
    job = fake.add("resnet", application="cifar10", min_gpus=2)
    fake.set_state(job.job_id, pb.JOB_STATE_RUNNING, gpus=2)
    assert sia("get", job.job_id, "--controller", target) == 0
    data = yaml.safe_load(capsys.readouterr().out)
    assert data["status"]["state"] == "RUNNING"
    assert data["status"]["allocation"]["gpus"] == ["n0:0", "n0:1"]
    assert data["spec"] == {"name": "resnet", "application": "cifar10", "min_gpus": 2}
    assert sia("get", job.job_id, "-o", "json", "--controller", target) == 0
    assert json.loads(capsys.readouterr().out) == data


def test_cancel_and_delete(target, fake, capsys):
    job = fake.add()
    assert sia("cancel", job.job_id, "--controller", target) == 0
    assert sia("delete", job.job_id, "--controller", target) == 0
    assert capsys.readouterr().out == f"{job.job_id} CANCELLED\n{job.job_id} deleted\n"
    assert job.job_id not in fake.jobs


def test_watch_prints_one_line_per_event_off_a_tty(target, fake, capsys):
    job = fake.add("resnet")
    fake.set_state(job.job_id, pb.JOB_STATE_RUNNING, gpus=2)
    fake.end_watch_after = 1  # the stream ends cleanly after the snapshot
    assert sia("watch", job.job_id, "--controller", target) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rev=2 SNAPSHOT {job.job_id} RUNNING gpus=2×rtx nodes=n0 batch=256")
    assert out.count("\n") == 1


def test_watch_redraws_in_place_on_a_tty(target, fake, monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Tty()
    monkeypatch.setattr("sys.stdout", screen)
    fake.add("a")
    fake.add("b")
    fake.end_watch_after = 2
    assert sia("watch", "--controller", target) == 0
    frames = screen.getvalue().split(client_cli.CLEAR)[1:]
    assert len(frames) == 2
    assert "NODES" in frames[1] and "job-1" in frames[1] and "job-2" in frames[1]


def test_watch_exits_0_on_ctrl_c(target, monkeypatch, capsys):
    def interrupted(self, **kwargs):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(SiaClient, "watch", interrupted)
    assert sia("watch", "--controller", target) == 0


def test_cluster_report(target, capsys):
    assert sia("cluster", "--controller", target) == 0
    out = capsys.readouterr().out
    assert "policy: sia  round: 60s" in out
    lines = out.splitlines()
    assert ["rtx", "2", "8", "4", "4"] in [ln.split() for ln in lines]  # type, nodes, gpus, ...
    assert ["n0", "rtx", "READY", "4/4", "job-1"] in [ln.split() for ln in lines]
    assert ["n1", "rtx", "READY", "0/4", "-"] in [ln.split() for ln in lines]
    assert lines[-1].split()[:5] == ["3", "timer", "3", "4", "0"]


def test_server_error_is_one_line(target, tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text("min_gpus = 4\nmax_gpus = 2\n")
    assert sia("submit", str(path), "--controller", target) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: INVALID_ARGUMENT: spec.max_gpus: must be >= min_gpus\n"


def test_unreachable_controller(dead_target, spec_file, capsys):
    assert sia("submit", str(spec_file), "--controller", dead_target) == 1
    assert capsys.readouterr().err == (
        f"error: cannot reach the controller at {dead_target} (UNAVAILABLE)\n")


def test_bad_spec_files_exit_2(tmp_path, dead_target, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("min_gpus: four\n")
    assert sia("submit", str(path), "--controller", dead_target) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: spec.min_gpus: expected a non-negative integer, got 'four'\n")
    assert sia("submit", str(tmp_path / "nope.yaml"), "--controller", dead_target) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'nope.yaml'}: cannot read: No such file or directory\n")


def test_not_found_is_one_line(target, capsys):
    assert sia("get", "ghost", "--controller", target) == 1
    assert capsys.readouterr().err == "error: NOT_FOUND: job 'ghost' not found\n"


def test_formatting_without_a_controller():
    job = pb.Job(job_id="j", status=pb.JobStatus(state=pb.JOB_STATE_QUEUED))
    assert client_cli.format_gpus(job) == "-" and client_cli.format_nodes(job) == "-"
    assert client_cli.table(["A", "LONG"], [["xyz", 1]]) == "A    LONG\nxyz  1"
    report = client_cli.cluster_report(pb.Cluster(), [])
    assert report.endswith("no scheduling rounds yet")
    assert client_cli.parse_state("JOB_STATE_RUNNING") == pb.JOB_STATE_RUNNING
