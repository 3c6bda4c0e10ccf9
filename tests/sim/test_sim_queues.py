"""Queues in the simulator's inputs: the trace's `queue` and `priority` columns, the
queues file with its assignment rule, the shipped example and the burst scenario."""

from __future__ import annotations

import collections
from importlib import resources

import pytest

from sia_grpc.policy.cluster import paper_hetero_cluster
from sia_grpc.policy.queues.files import (
    QueuesError,
    assign,
    bucket,
    burst,
    parse_queues,
    read_queues,
)
from sia_grpc.sim.workload import TraceJob, WorkloadError, load_workload, workload_csv

HEADER = "name,time,application,num_replicas,batch_size"


def shipped(name: str):
    return resources.files("sia_grpc").joinpath("data", "queues", name)


@pytest.fixture
def qfile(queues_path):
    return read_queues(queues_path)


def trace(tmp_path, header: str, *rows: str):
    path = tmp_path / "t.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


# ------------------------------------------------------------ the trace's columns


def test_queue_and_priority_columns_are_read(tmp_path, qfile):
    path = trace(tmp_path, HEADER + ",queue,priority",
                 "j0,0,ncf,1,256,a,prod", "j1,5,ncf,1,256,,", "j2,9,ncf,1,256,b,")
    jobs = load_workload(path, qfile.queues)
    assert [(j.queue, j.priority) for j in jobs] == [("a", "prod"), ("", ""), ("b", "")]
    # Without the columns: nothing named.
    plain = load_workload(trace(tmp_path, HEADER, "j0,0,ncf,1,256"))
    assert (plain[0].queue, plain[0].priority) == ("", "")


@pytest.mark.parametrize(("cells", "field", "says"), [
    ("nope,", "queue", "unknown queue 'nope'; the cluster has a, b, default"),
    ("a,vip", "priority", "unknown priority class 'vip'"),
    ("a b,", "queue", "'a b' is not a valid name"),
])
def test_unknown_queue_or_class_names_the_line_and_column(tmp_path, qfile, cells, field, says):
    path = trace(tmp_path, HEADER + ",queue,priority", "j0,0,ncf,1,256,a,",
                 f"j1,0,ncf,1,256,{cells}")
    with pytest.raises(WorkloadError) as err:
        load_workload(path, qfile.queues)
    assert f"t.csv line 3: {field}: " in str(err.value) and says in str(err.value)


def test_names_are_checked_without_a_queues_file_too(tmp_path):
    with pytest.raises(WorkloadError, match="line 2: queue: 'x/y' is not a valid name"):
        load_workload(trace(tmp_path, HEADER + ",queue", "j0,0,ncf,1,256,x/y"))


def test_csv_round_trip(tmp_path, qfile):
    jobs = assign(load_workload("saturn/workload-1", qfile.queues), qfile)
    path = tmp_path / "out.csv"
    path.write_text(workload_csv(jobs))
    assert load_workload(path, qfile.queues) == jobs


# ------------------------------------------------------------ the assignment rule


def test_bucket_is_the_sha256_of_the_name():
    # 0xe1c3..: the first 8 bytes of sha256(b"j0"), a fixed point of the rule.
    assert bucket("j0") == 16267851538648448504 / 2**64
    assert 0 <= bucket("") < 1 and bucket("j0") != bucket("j1")


def test_assignment_follows_the_shares_and_keeps_a_named_queue(qfile):
    jobs = [TraceJob(f"job-{i}", 0.0, "ncf", 1, 256) for i in range(8000)]
    counts = collections.Counter(j.queue for j in assign(jobs, qfile))
    assert set(counts) == {"a", "b"}
    assert counts["a"] / len(jobs) == pytest.approx(0.75, abs=0.02)
    named = assign([TraceJob("j", 0.0, "ncf", 1, 256, queue="b")], qfile)
    assert named[0].queue == "b"
    # The rule depends on the name only: the same job lands alike in any trace.
    moved = TraceJob("job-7", 999.0, "bert", 4, 64)
    assert assign([moved], qfile)[0].queue == assign(jobs[7:8], qfile)[0].queue


def test_without_an_assignment_jobs_go_to_default():
    file = parse_queues({"queue": [{"name": "a"}]})
    assert file.assignment is None
    assert assign([TraceJob("j", 0.0, "ncf", 1, 256)], file)[0].queue == "default"


# ------------------------------------------------------------ the queues file


@pytest.mark.parametrize(("text", "says"), [
    ("[assignment]\nby = 'round-robin'\nshares = {default = 1}",
     "assignment.by: unknown rule 'round-robin'"),
    ("[assignment]\nshares = {x = 1}", "assignment.shares.x: no such queue"),
    ("[assignment]\nshares = {default = 0}", "assignment.shares.default: must be a positive"),
    ("[assignment]\nshares = {default = true}", "assignment.shares.default: must be a positive"),
    ("[assignment]\nshares = {}", "assignment.shares: expected a table"),
    ("[assignment]\nshare = {default = 1}", "assignment.share: unknown key"),
    ("assignment = 3", "assignment: expected a table"),
    ("[[queue]]\nname = 'a'\nguarantee = {rtx = -1}", "queue[0].guarantee.rtx: must be a whole"),
    ("[[queue]]\nname = 'a'\nlimit = 3", "queue[0].limit: unknown key"),
    ("nope = 1", "nope: unknown key"),
    ("[[queue]\n", "Expected"),  # the TOML parser's own message, with the file named
])
def test_bad_queues_files_name_the_file_and_key(tmp_path, text, says):
    path = tmp_path / "q.toml"
    path.write_text(text)
    with pytest.raises(QueuesError) as err:
        read_queues(path)
    assert str(err.value).startswith(f"{path}: ") and says in str(err.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(QueuesError, match="missing.toml"):
        read_queues(tmp_path / "missing.toml")


def test_the_shipped_three_queues():
    with resources.as_file(shipped("three-queues.toml")) as path:
        file = read_queues(path)
    capacity = paper_hetero_cluster(1).capacity
    queues = {q.name: q for q in file.queues.queues}
    assert list(queues) == ["research", "product", "infra", "default"]
    for t, cap in capacity.items():
        got = [queues[q].guarantee[t] for q in ("research", "product", "infra")]
        assert sum(got) == cap  # the whole type, rounded by largest remainder
        for g, share in zip(got, (0.5, 0.3, 0.2), strict=True):
            assert abs(g - share * cap) < 1
    assert dict(file.assignment.shares) == {"research": 5, "product": 3, "infra": 2}
    assert file.queues.default_priority == "batch"


def test_the_shipped_burst_is_generated_from_saturn_1():
    """The shipped burst scenario is `burst` of saturn/workload-1 under the shipped
    queues: research idle for 3 hours, then every research job of them at once."""
    with resources.as_file(shipped("three-queues.toml")) as path:
        file = read_queues(path)
    base = assign(load_workload("saturn/workload-1", file.queues), file)
    with resources.as_file(shipped("burst-saturn-1.csv")) as path:
        shipped_jobs = load_workload(path, file.queues)
    assert shipped_jobs == burst(base, "research", 3 * 3600.0)
    research = [j for j in shipped_jobs if j.queue == "research"]
    assert min(j.time for j in research) == 3 * 3600.0
    assert sum(j.time == 3 * 3600.0 for j in research) > 20  # the flood


def test_burst_moves_only_that_queues_early_jobs():
    jobs = (TraceJob("a0", 10.0, "ncf", 1, 256, queue="a"),
            TraceJob("b0", 20.0, "ncf", 1, 256, queue="b"),
            TraceJob("a1", 500.0, "ncf", 1, 256, queue="a"))
    out = burst(jobs, "a", 100.0)
    assert [(j.name, j.time) for j in out] == [("b0", 20.0), ("a0", 100.0), ("a1", 500.0)]
