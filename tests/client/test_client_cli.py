"""The controller commands (the job commands and the cluster views), registered on a
fresh parser with their add_commands, and their formatting functions."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import subprocess
import sys

import pytest
import yaml
from google.protobuf import json_format

from sia_grpc.api import pb, present
from sia_grpc.cli import cluster, run
from sia_grpc.cli import jobs as client_cli
from sia_grpc.client import SiaClient


def sia(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="sia")
    sub = parser.add_subparsers(dest="command", required=True)
    client_cli.add_commands(sub)
    cluster.add_commands(sub)
    return run(parser.parse_args(argv))


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


NOW = 1_767_605_400.0  # 2026-01-05T09:30:00Z


@pytest.fixture
def clock(monkeypatch):
    """AGE is measured from NOW."""
    monkeypatch.setattr(client_cli, "_now", lambda: NOW)


def test_ls_table_sorted_with_tenant_nodes_and_age(target, fake, capsys, clock):
    # Listed oldest first whatever order the controller sends them in; a tie on the
    # create time goes by job id.
    b = fake.add("bert", tenant="nlp", created=NOW - 10800, job_id="b-1")
    a = fake.add("resnet", created=NOW - 330, job_id="a-1")
    c = fake.add("ncf", created=NOW - 10800, job_id="a-2")
    fake.set_state(a.job_id, pb.JOB_STATE_RUNNING, gpus=4, progress=0.25, restarts=2,
                   reason="grew to 4 GPUs")
    assert sia("ls", "--controller", target) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "TENANT", "STATE", "GPUS", "NODES", "PROGRESS",
                                "RESTARTS", "AGE", "REASON"]
    assert [ln.split() for ln in lines[1:]] == [
        [c.job_id, "ncf", "-", "QUEUED", "-", "-", "0%", "0", "3h"],
        [b.job_id, "bert", "nlp", "QUEUED", "-", "-", "0%", "0", "3h"],
        [a.job_id, "resnet", "-", "RUNNING", "4×rtx", "n0", "25%", "2", "5m30s", "grew", "to",
         "4", "GPUs"]]

    assert sia("ls", "-o", "wide", "--controller", target) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "TENANT", "QUEUE", "PRIORITY", "APPLICATION",
                                "STATE", "GPUS", "NODES", "BATCH", "PROGRESS", "GOODPUT",
                                "RESTARTS", "GENERATION", "AGE", "REASON"]
    assert lines[3].split()[:10] == [a.job_id, "resnet", "-", "default", "default", "-",
                                     "RUNNING", "4×rtx", "n0", "256"]

    assert sia("ls", "--state", "queued", "--tenant", "nlp", "--controller", target) == 0
    assert [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:]] == [b.job_id]
    assert sia("ls", "--state", "failed", "--controller", target) == 0
    assert capsys.readouterr().out == "no jobs\n"


def test_ls_json_is_the_proto3_mapping_in_ls_order(target, fake, capsys):
    late = fake.add("late", created=NOW, tenant="nlp")
    early = fake.add("early", created=NOW - 60)
    fake.set_state(early.job_id, pb.JOB_STATE_RUNNING, gpus=2)
    assert sia("ls", "-o", "json", "--controller", target) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["jobs"]
    first, second = data["jobs"]
    assert (first["job_id"], second["job_id"]) == (early.job_id, late.job_id)
    assert first["status"]["state"] == "JOB_STATE_RUNNING"
    assert first["status"]["allocation"]["gpus"][1] == {"node": "n0", "index": 1}
    assert first["status"]["create_time"] == "2026-01-05T09:29:00Z"
    assert second["spec"]["tenant"] == "nlp" and second["status"]["restarts"] == 0  # always there
    assert first["revision"] == str(fake.jobs[early.job_id].revision)  # uint64: a string
    # The shape is protobuf's own: it parses back into the message.
    assert json_format.ParseDict(first, pb.Job()) == fake.jobs[early.job_id]
    assert sia("ls", "-o", "yaml", "--controller", target) == 0
    assert yaml.safe_load(capsys.readouterr().out) == data
    assert sia("ls", "-o", "json", "--state", "failed", "--controller", target) == 0
    assert json.loads(capsys.readouterr().out) == {"jobs": []}


def test_ls_rejects_an_unknown_state(capsys):
    with pytest.raises(SystemExit) as exit_:
        sia("ls", "--state", "sleeping")
    assert exit_.value.code == 2 and "unknown state 'sleeping'" in capsys.readouterr().err


def test_get_readable_json_yaml_and_wide(target, fake, capsys, clock):
    job = fake.add("resnet", application="cifar10", min_gpus=2, created=NOW - 90)
    fake.set_state(job.job_id, pb.JOB_STATE_RUNNING, gpus=2, restarts=1, throughput=812.5,
                   restart_seconds=41.5)
    assert sia("get", job.job_id, "--controller", target) == 0
    data = yaml.safe_load(capsys.readouterr().out)  # the readable view
    assert data["status"]["state"] == "RUNNING"
    assert (data["status"]["throughput"], data["status"]["restart_seconds"]) == (812.5, 41.5)
    assert data["status"]["allocation"]["gpus"] == ["n0:0", "n0:1"]
    assert data["spec"] == {"name": "resnet", "application": "cifar10", "min_gpus": 2}
    assert sia("get", job.job_id, "-o", "json", "--controller", target) == 0
    proto = json.loads(capsys.readouterr().out)
    assert json_format.ParseDict(proto, pb.Job()) == fake.jobs[job.job_id]
    assert proto["status"]["state"] == "JOB_STATE_RUNNING"
    assert sia("get", job.job_id, "-o", "yaml", "--controller", target) == 0
    assert yaml.safe_load(capsys.readouterr().out) == proto
    assert sia("get", job.job_id, "-o", "wide", "--controller", target) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:6] == ["ID", "NAME", "TENANT", "QUEUE", "PRIORITY", "APPLICATION"]
    # PRIORITY: the configured default class, by name (issue 37, item 7)
    assert row.split()[:7] == [job.job_id, "resnet", "-", "default", "default", "cifar10",
                               "RUNNING"]
    assert row.split()[-1] == "90s"


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


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def screen(fake) -> Tty:
    """A terminal for stdout (the test sets it: pytest's capture would undo it here);
    two jobs, and each watch ends after their snapshot."""
    fake.add("a")
    fake.add("b")
    fake.end_watch_after = 2
    return Tty()


def test_watch_redraws_in_place_on_a_tty(target, screen, monkeypatch):
    monkeypatch.setattr("sys.stdout", screen)
    assert sia("watch", "--controller", target) == 0
    frames = screen.getvalue().split(client_cli.CLEAR)[1:]
    assert len(frames) == 2
    assert "NODES" in frames[1] and "job-1" in frames[1] and "job-2" in frames[1]
    assert "TENANT" in frames[1] and "AGE" in frames[1]


def test_watch_events_prints_lines_even_on_a_tty(target, screen, monkeypatch):
    monkeypatch.setattr("sys.stdout", screen)
    assert sia("watch", "--events", "--controller", target) == 0
    out = screen.getvalue()
    assert client_cli.CLEAR not in out
    assert [ln.split()[1:3] for ln in out.splitlines()] == [["SNAPSHOT", "job-1"],
                                                            ["SNAPSHOT", "job-2"]]


def test_watch_exits_0_on_ctrl_c(target, monkeypatch, capsys):
    def interrupted(self, **kwargs):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(SiaClient, "watch", interrupted)
    assert sia("watch", "--controller", target) == 0


def test_cluster_report(target, fake, capsys):
    assert sia("cluster", "--controller", target) == 0
    out = capsys.readouterr().out
    assert "policy: sia  round: 60s" in out
    lines = out.splitlines()
    assert ["rtx", "2", "8", "4", "4"] in [ln.split() for ln in lines]  # type, nodes, gpus, ...
    assert ["n0", "rtx", "READY", "4/4", "-", "job-1"] in [ln.split() for ln in lines]
    assert ["n1", "rtx", "READY", "0/4", "-", "-"] in [ln.split() for ln in lines]
    assert lines[-4].split()[:2] == ["ROUND", "START"]
    assert lines[-1].split()[:6] == ["3", "2026-01-05T09:32:00Z", "timer", "3", "4", "0"]

    assert sia("cluster", "-o", "wide", "--rounds", "2", "--controller", target) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "LAST HEARTBEAT" in lines[lines.index(next(ln for ln in lines
                                                      if ln.startswith("NODE")))]
    assert lines[-3].split()[-3:] == ["OBJECTIVE", "END", "NOTE"]
    assert lines[-1].split()[-1] == "2026-01-05T09:32:01Z" and lines[-2].split()[0] == "2"


def test_a_skipped_round_is_listed_without_a_number():
    skipped = pb.Round(trigger="drain", note="skipped: no ready node (1 draining)")
    lines = present.cluster_report(pb.Cluster(policy="sia"), [skipped]).splitlines()
    assert lines[-1].split()[:3] == ["-", "-", "drain"] and lines[-1].endswith("draining)")


def test_cluster_json_holds_the_cluster_and_its_rounds(target, fake, capsys):
    assert sia("cluster", "-o", "json", "--controller", target) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["cluster", "rounds"]
    assert json_format.ParseDict(data["cluster"], pb.Cluster()) == fake.cluster
    assert data["cluster"]["nodes"][0]["state"] == "NODE_STATE_READY"
    assert [r["round"] for r in data["rounds"]] == ["1", "2", "3"]
    assert data["rounds"][0]["start_time"] == "2026-01-05T09:30:00Z"
    assert data["rounds"][0]["note"] == ""


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
    assert present.format_gpus(job) == "-" and present.format_nodes(job) == "-"
    assert present.table(["A", "LONG"], [["xyz", 1]]) == "A    LONG\nxyz  1"
    report = present.cluster_report(pb.Cluster(), [])
    assert report.endswith("no scheduling rounds yet")
    assert client_cli.parse_state("JOB_STATE_RUNNING") == pb.JOB_STATE_RUNNING


@pytest.mark.parametrize(("seconds", "age"), [
    (-5, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (330, "5m30s"), (600, "10m"),
    (10799, "179m"), (10800, "3h"), (3 * 3600 + 1800, "3h30m"), (8 * 3600 + 60, "8h"),
    (47 * 3600, "47h"), (2 * 86400, "2d"), (3 * 86400 + 4 * 3600, "3d4h"), (400 * 86400, "400d"),
    (3 * 365 * 86400 + 86400, "3y1d"), (9 * 365 * 86400, "9y")])
def test_age_is_kubectl_style(seconds, age):
    assert present.format_age(seconds) == age


def test_version_is_the_installed_package_version(capsys):
    from sia_grpc.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"sia {importlib.metadata.version('sia-grpc')}\n"


def test_submit_reads_a_spec_from_stdin(target, fake, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("name: resnet\napplication: cifar10\n"
                                                 "adaptivity: adaptive\nmax_gpus: 4\n"))
    assert sia("submit", "-", "--id", "r1", "--controller", target) == 0
    assert capsys.readouterr().out == "r1\n"
    assert fake.jobs["r1"].spec.adaptivity == pb.ADAPTIVITY_ADAPTIVE
    monkeypatch.setattr("sys.stdin", io.StringIO('{"name": "x", "max_gpu": 4}'))  # JSON too
    assert sia("submit", "-", "--controller", target) == 2
    assert capsys.readouterr().err == ("error: <stdin>: spec.max_gpu: unknown field "
                                       "(did you mean max_gpus?)\n")


def test_submit_several_files_checks_them_all_first(target, fake, spec_file, tmp_path, capsys):
    other = tmp_path / "bert.toml"
    other.write_text('name = "bert"\napplication = "bert"\nadaptivity = "rigid"\n'
                     "num_gpus = 2\n")
    assert sia("submit", str(spec_file), str(other), "--controller", target) == 0
    assert capsys.readouterr().out.split() == ["job-1", "job-2"]
    assert [j.spec.name for j in fake.jobs.values()] == ["resnet", "bert"]

    # One bad file: each bad one is named, and none of them is submitted.
    bad, worse = tmp_path / "bad.yaml", tmp_path / "worse.json"
    bad.write_text("min_gpus: -1\n")
    worse.write_text("{")
    assert sia("submit", str(spec_file), str(bad), str(worse), "--controller", target) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(fake.jobs) == 2
    assert captured.err.splitlines() == [
        f"error: {bad}: spec.min_gpus: expected a non-negative integer, got -1",
        f"error: {worse}:1: invalid JSON: Expecting property name enclosed in double quotes"]

    # The controller turns one down: the others are still submitted, and the exit is 1.
    refused = tmp_path / "refused.yaml"
    refused.write_text("min_gpus: 4\nmax_gpus: 2\n")
    assert sia("submit", str(refused), str(spec_file), "--controller", target) == 1
    captured = capsys.readouterr()
    assert captured.out.split() == ["job-3"] and len(fake.jobs) == 3
    assert captured.err == (f"error: {refused}: INVALID_ARGUMENT: spec.max_gpus: "
                            "must be >= min_gpus\n")


def test_submit_usage_errors(spec_file, dead_target, capsys):
    assert sia("submit", str(spec_file), str(spec_file), "--id", "x",
               "--controller", dead_target) == 2
    assert "--id: names one job" in capsys.readouterr().err
    assert sia("submit", "-", "-", "--controller", dead_target) == 2
    assert "'-' (standard input) can be given once" in capsys.readouterr().err


def _subparsers(parser: argparse.ArgumentParser, path: str = "sia"):
    """(command path, parser, its summary in the parent's list) for every subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", sub, summaries.get(name)
                yield from _subparsers(sub, f"{path} {name}")


def test_every_subcommand_has_a_description_and_documented_positionals():
    from sia_grpc.cli import build_parser

    commands = list(_subparsers(build_parser()))
    names = {path for path, _, _ in commands}
    assert {"sia bench policy", "sia bench load", "sia demo", "sia simulate", "sia certs init",
            "sia tokens list", "sia tokens revoke", "sia forget", "sia submit"} <= names
    for path, sub, summary in commands:
        assert sub.description and summary == sub.description, path  # one line, both places
        text = sub.format_help()
        assert sub.description.split()[0] in text, path
        for action in sub._actions:
            if action.option_strings or isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{path}: positional {action.dest} has no help"
            assert (action.metavar or action.dest) in text, path


@pytest.mark.timeout(60)
def test_a_reader_that_leaves_early_is_not_a_traceback(target, fake):
    """`sia ls -o json | head`: the pipe closes while sia still writes."""
    for i in range(300):  # well past a pipe's buffer
        fake.add(f"j{i}", labels={"note": "x" * 200})
    with subprocess.Popen([sys.executable, "-m", "sia_grpc.cli", "ls", "-o", "json",
                           "--controller", target],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout.read(10) == b'{\n  "jobs"'
        proc.stdout.close()
        assert proc.wait(timeout=30) == 141
        assert proc.stderr.read() == b""
