"""The blocking SiaClient against a real gRPC server backed by the fake controller."""

from __future__ import annotations

import copy
import itertools
import threading
import time

import grpc
import pytest

from sia_grpc.api import pb
from sia_grpc.api.errors import ApiError
from sia_grpc.client import Backoff, JobState, JobView, SiaClient, SpecError, is_terminal

SPEC = pb.JobSpec(name="resnet", application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE,
                  min_gpus=1, max_gpus=4)


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def client(target, sleeps):
    # rand=1: the largest delay of each step, so the schedule is checkable exactly.
    with SiaClient(target, timeout=5, sleep=sleeps.append, rand=lambda: 1.0) as sia:
        yield sia


def test_submit_get_cancel_delete(client, fake):
    handle = client.submit(SPEC, job_id="resnet-1")
    assert handle.job_id == "resnet-1"
    job = client.get("resnet-1")
    assert job.spec == SPEC and job.status.state == pb.JOB_STATE_QUEUED
    assert handle.status().state == pb.JOB_STATE_QUEUED

    assert handle.cancel().status.state == pb.JOB_STATE_CANCELLED
    client.delete("resnet-1")
    with pytest.raises(ApiError) as err:
        client.get("resnet-1")
    assert err.value.code == grpc.StatusCode.NOT_FOUND and err.value.reason == "JOB_NOT_FOUND"


def test_submit_takes_the_mapping_a_spec_file_holds(client, fake):
    handle = client.submit({"name": "resnet", "application": "cifar10",
                            "adaptivity": "adaptive", "min_gpus": 1, "max_gpus": 4},
                           job_id="resnet-1")
    assert fake.jobs[handle.job_id].spec == SPEC
    with pytest.raises(SpecError) as err:  # checked here, named as in a spec file
        client.submit({"name": "x", "adaptivity": "elastic"})
    assert err.value.field == "spec.adaptivity"
    assert str(err.value) == ("spec.adaptivity: expected one of adaptive, strong-scaling, "
                              "rigid, got 'elastic'")
    with pytest.raises(SpecError, match=r"spec.max_gpu: unknown field \(did you mean max_gpus"):
        client.submit({"max_gpu": 4})
    with pytest.raises(TypeError, match="spec: expected a pb.JobSpec or a mapping"):
        client.submit("job.yaml")
    assert fake.calls["CreateJob"] == 1  # only the good one reached the controller


def test_jobs_come_back_with_states_by_name(client, fake, capsys):
    handle = client.submit(SPEC)
    job = handle.job()
    assert isinstance(job, JobView) and isinstance(job.proto, pb.Job)
    assert job.state is JobState.QUEUED and job.status.state is JobState.QUEUED
    assert job.state == pb.JOB_STATE_QUEUED and job == fake.jobs[job.job_id]
    assert pb.JobState.Name(job.status.state) == "JOB_STATE_QUEUED"  # still the number
    print(handle.cancel().status.state, job.state, f"{handle.status().state:>10}")
    assert capsys.readouterr().out == "CANCELLED QUEUED  CANCELLED\n"
    assert [j.state for j in client.list()] == [JobState.CANCELLED]
    assert str(client.get(job.job_id).state) == "CANCELLED"
    assert repr(job) == f"JobView({job.job_id!r}, state=QUEUED)"
    with pytest.raises(AttributeError, match="read-only"):
        job.job_id = "other"
    assert pb.Job(job_id="x", status=job.status.proto).status.state == pb.JOB_STATE_QUEUED
    assert copy.deepcopy(job) == job


def test_submit_sends_a_fresh_request_id_and_honours_a_given_one(client, fake):
    a, b = client.submit(SPEC), client.submit(SPEC)
    assert a.job_id != b.job_id and len(fake.by_request) == 2  # two distinct uuids
    c, d = client.submit(SPEC, request_id="r1"), client.submit(SPEC, request_id="r1")
    assert c.job_id == d.job_id and len(fake.jobs) == 3


def test_server_error_names_the_field(client):
    with pytest.raises(ApiError) as err:
        client.submit(pb.JobSpec(name="x", min_gpus=4, max_gpus=2))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.field == "spec.max_gpus"
    assert str(err.value) == "INVALID_ARGUMENT: spec.max_gpus: must be >= min_gpus"


def test_list_follows_page_tokens_and_filters(client, fake):
    ids = [fake.add(f"j{i}").job_id for i in range(5)]
    fake.set_state(ids[1], pb.JOB_STATE_RUNNING)
    assert [j.job_id for j in client.list(page_size=2)] == ids
    assert fake.calls["ListJobs"] == 3
    assert [j.job_id for j in client.list(states=[pb.JOB_STATE_RUNNING])] == [ids[1]]
    assert list(client.list(tenant="nobody")) == []


def test_reads_retry_unavailable_with_backoff(client, fake, sleeps):
    fake.add()
    fake.fail["GetJob"] = 3
    assert client.get("job-1").job_id == "job-1"
    assert fake.calls["GetJob"] == 4
    assert sleeps == pytest.approx([0.1, 0.2, 0.4])
    fake.fail["ListJobs"] = fake.fail["GetCluster"] = fake.fail["ListRounds"] = 1
    assert len(list(client.list())) == 1 and client.cluster().policy == "sia"
    assert len(client.rounds()) == 3
    assert fake.calls["ListJobs"] == fake.calls["GetCluster"] == fake.calls["ListRounds"] == 2


def test_reads_give_up_after_read_retries(target, fake):
    fake.fail["GetJob"] = 10
    with SiaClient(target, read_retries=2, sleep=lambda s: None) as sia, \
            pytest.raises(ApiError) as err:
        sia.get("job-1")
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and fake.calls["GetJob"] == 3


def test_other_errors_are_not_retried(client, fake, sleeps):
    with pytest.raises(ApiError):
        client.get("missing")
    assert fake.calls["GetJob"] == 1 and sleeps == []


def test_writes_are_not_retried(client, fake, sleeps):
    fake.fail["CreateJob"] = fake.fail["CancelJob"] = 1
    with pytest.raises(ApiError) as err:
        client.submit(SPEC)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert fake.calls["CreateJob"] == 1 and fake.jobs == {} and sleeps == []
    job = fake.add()
    with pytest.raises(ApiError):
        client.cancel(job.job_id)
    assert fake.calls["CancelJob"] == 1


def test_backoff_is_full_jitter_exponential_and_capped():
    top = Backoff(rand=lambda: 1.0)
    assert [top.delay(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0])
    assert Backoff(rand=lambda: 0.25).delay(2) == pytest.approx(0.1)


@pytest.mark.parametrize("inclusive", [False, True])
def test_watch_resumes_after_the_last_revision(client, fake, sleeps, inclusive):
    fake.inclusive = inclusive
    jobs = [fake.add() for _ in range(3)]  # revisions 1..3
    fake.set_state(jobs[0].job_id, pb.JOB_STATE_RUNNING)  # 4
    fake.set_state(jobs[1].job_id, pb.JOB_STATE_RUNNING)  # 5
    fake.break_watch_after = [2]
    events = client.watch(since_revision=1)
    got = [ev.revision for ev in itertools.islice(events, 4)]
    events.close()
    assert got == [2, 3, 4, 5]  # no gap, no repeat
    last_before_break = 3 if not inclusive else 2  # an inclusive server sent 1 and 2
    assert [r.since_revision for r in fake.watch_requests] == [1, last_before_break]
    assert len(sleeps) == 1


def test_watch_restarts_a_snapshot_cut_short(client, fake):
    ids = {fake.add().job_id for _ in range(3)}
    fake.break_watch_after = [2]
    events = client.watch()
    got = list(itertools.islice(events, 5))
    events.close()
    assert all(ev.kind == pb.JobEvent.KIND_SNAPSHOT for ev in got)
    assert {ev.job.job_id for ev in got[2:]} == ids  # the second snapshot is whole
    assert [r.since_revision for r in fake.watch_requests] == [0, 0]


def test_watch_gives_up_after_read_retries(target, fake):
    fake.fail["WatchJobs"] = 10
    with SiaClient(target, read_retries=2, sleep=lambda s: None) as sia, \
            pytest.raises(ApiError) as err:
        next(sia.watch())
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and fake.calls["WatchJobs"] == 3


def test_watch_rounds_reopens_a_broken_stream(client, fake, sleeps):
    fake.fail["WatchRounds"] = 1
    rounds = client.watch_rounds()
    assert [r.round for r in itertools.islice(rounds, 3)] == [1, 2, 3]
    rounds.close()
    assert fake.calls["WatchRounds"] == 2 and sleeps == pytest.approx([0.1])


def test_handle_watch_yields_versions_until_terminal(client, fake):
    handle = client.submit(SPEC)
    following = {pb.JOB_STATE_QUEUED: pb.JOB_STATE_RUNNING,
                 pb.JOB_STATE_RUNNING: pb.JOB_STATE_SUCCEEDED}
    states = []
    for job in handle.watch():
        states.append(job.status.state)
        if job.status.state in following:
            fake.add("unrelated")  # other jobs' events are not versions of this one
            fake.set_state(handle.job_id, following[job.status.state])
    assert states == [pb.JOB_STATE_QUEUED, pb.JOB_STATE_RUNNING, pb.JOB_STATE_SUCCEEDED]


def test_wait_returns_the_terminal_job(client, fake):
    handle = client.submit(SPEC)
    timer = threading.Timer(0.05, fake.set_state, (handle.job_id, pb.JOB_STATE_FAILED),
                            {"message": "oom"})
    timer.start()
    job = handle.wait(timeout=5)
    timer.join()
    assert is_terminal(job) and job.status.state == pb.JOB_STATE_FAILED
    assert job.status.message == "oom"


def test_wait_on_a_finished_job_does_not_watch(client, fake):
    job = fake.add()
    fake.set_state(job.job_id, pb.JOB_STATE_SUCCEEDED)
    assert client.handle(job.job_id).wait().status.state == pb.JOB_STATE_SUCCEEDED
    assert fake.calls["WatchJobs"] == 0


def test_wait_times_out_cleanly(client):
    handle = client.submit(SPEC)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0.2)
    assert 0.15 < time.monotonic() - start < 2


def test_close_is_idempotent_and_leaves_a_given_channel_open(target):
    channel = grpc.insecure_channel(target)
    with SiaClient(channel=channel) as sia:
        sia.submit(SPEC)
    sia.close()
    with SiaClient(channel=channel) as again:  # the channel still works
        assert len(list(again.list())) == 1
    channel.close()


def test_unreachable_controller_is_an_api_error(dead_target):
    with SiaClient(dead_target, read_retries=1, sleep=lambda s: None) as sia, \
            pytest.raises(ApiError) as err:
        sia.get("x")
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
