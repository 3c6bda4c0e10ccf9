"""Issue 37, item 7, on the command line: `sia queues` shows a type-flexible guarantee
in units, and no BORROWED column where no queue has a guarantee; `sia ls -o wide`
names a job's priority class, the configured default one included. The same words
as the dashboard's (`api/present.py`)."""

from __future__ import annotations

import argparse

from sia_grpc.api import pb, present
from sia_grpc.cli import cluster, run
from sia_grpc.cli import jobs as client_cli


def sia(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="sia")
    sub = parser.add_subparsers(dest="command", required=True)
    client_cli.add_commands(sub)
    cluster.add_commands(sub)
    return run(parser.parse_args(argv))


def test_sia_queues_with_no_queues_configured_has_no_borrowed_column(target, capsys):
    assert sia("queues", "--controller", target) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.split() == ["QUEUE", "TENANTS", "GUARANTEE", "HELD", "PENDING", "RUNNING"]


def test_sia_queues_shows_a_type_flexible_guarantee_in_units(target, fake, capsys):
    fake.queues = pb.ListQueuesResponse(queues=[
        pb.QueueStatus(spec=pb.QueueSpec(name="flex", guarantee_units=4.0),
                       held={"aws": 2}, held_units=2.0, running_jobs=1),
        pb.QueueStatus(spec=pb.QueueSpec(name="default"))],
        config=pb.QueueConfig(default_priority="default"))
    assert sia("queues", "--controller", target) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "BORROWED" in lines[0] and "BORROW LIMIT" not in lines[0]
    flex = lines[1]
    assert "4 units (any type)" in flex and "2 aws (2 units)" in flex


def test_sia_ls_wide_names_the_default_priority_class(target, fake, capsys):
    fake.queues.config.default_priority = "normal"
    fake.add("bert", job_id="b-1")
    fake.add("gpt", job_id="g-1", priority="urgent")
    assert sia("ls", "-o", "wide", "--controller", target) == 0
    lines = capsys.readouterr().out.splitlines()
    column = lines[0].split().index("PRIORITY")
    assert [ln.split()[column] for ln in lines[1:]] == ["normal", "urgent"]


def test_the_priority_shown_is_the_class_the_job_is_scheduled_as():
    job = pb.Job(spec=pb.JobSpec())
    assert present.job_priority(job, "normal") == "normal"
    assert present.job_priority(job, None) == "-"  # the configuration unknown: not guessed
    job.spec.priority = "urgent"
    assert present.job_priority(job, "normal") == "urgent"
