"""Fuzz every client-facing RPC of a real controller on loopback: hypothesis-built
requests (every answer is OK or a typed error, never INTERNAL/UNKNOWN, and
INVALID_ARGUMENT names the field), then mutated valid messages sent as raw bytes
to every unary method (the server answers each with a status and keeps serving).
The tally of cases per RPC is printed at the end of the run (see fuzzkit)."""

from __future__ import annotations

import collections
import random

import grpc
import pytest
from fuzzkit import (
    APPS,
    TALLY,
    TYPED,
    check_answer,
    create_requests,
    doubles,
    examples,
    field_of,
    healthy,
    i32_enum,
    job_specs,
    long_text,
    mutate,
    names,
    record,
    texts,
    u32,
    u64,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sia_grpc.api import (
    AgentServiceStub,
    ClusterServiceStub,
    JobServiceStub,
    PolicyServiceStub,
    pb,
)
from sia_grpc.names import scoped_job_id

FUZZ = dict(deadline=None, database=None, derandomize=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                   HealthCheck.function_scoped_fixture])


def call(rpc: str, fn, request, allowed=TYPED, timeout: float = 20.0):
    try:
        out = fn(request, timeout=timeout)
    except grpc.RpcError as err:
        check_answer(rpc, err, allowed)
        return None
    check_answer(rpc, None)
    return out


# ---------------------------------------------------------------- (a) generated messages


def _valid_spec(app: str) -> pb.JobSpec:
    return pb.JobSpec(name=app, application=app, adaptivity=pb.ADAPTIVITY_ADAPTIVE)


@st.composite
def near_valid_specs(draw) -> pb.JobSpec:
    """A valid spec with one or two fields replaced by something hostile: most
    cases then get past the first check and reach the deeper ones (or are accepted)."""
    spec = _valid_spec(draw(st.sampled_from(APPS)))
    wild = draw(job_specs())
    for field in draw(st.lists(st.sampled_from(
            ["name", "min_gpus", "max_gpus", "num_gpus", "batch_size", "max_batch_size",
             "pipeline_gpus", "restart_cost_s", "tenant", "allowed_gpu_types",
             "type_batch_limits", "labels", "target", "command", "adaptivity"]),
            min_size=1, max_size=2)):
        if field == "target":
            which = wild.WhichOneof("target")
            if which:
                setattr(spec, which, getattr(wild, which))
        elif field in ("allowed_gpu_types", "type_batch_limits", "command"):
            getattr(spec, field).extend(getattr(wild, field))
        elif field == "labels":
            spec.labels.update(wild.labels)
        else:
            setattr(spec, field, getattr(wild, field))
    return spec


def _accepted(stub, job: pb.Job | None, request: pb.CreateJobRequest) -> None:
    """An accepted job is there, with its spec, and its id is one the API allows."""
    if job is None:
        return
    got = stub.GetJob(pb.GetJobRequest(job_id=job.job_id), timeout=10)
    assert got.job_id == job.job_id and got.spec == request.spec
    # Ids are scoped by tenant (`tenant/name`): the name is one the API allows.
    tenant, _, name = job.job_id.rpartition("/")
    assert tenant == job.spec.tenant and 1 <= len(name) <= 63
    if request.job_id:
        assert job.job_id == scoped_job_id(job.spec.tenant, request.job_id)


@settings(max_examples=examples(120), **FUZZ)
@given(spec=st.one_of(job_specs(), near_valid_specs(), near_valid_specs()))
def test_create_job_with_generated_specs_answers_ok_or_a_typed_error(channel, spec):
    stub = JobServiceStub(channel)
    request = pb.CreateJobRequest(spec=spec)
    _accepted(stub, call("JobService/CreateJob", stub.CreateJob, request), request)


@settings(max_examples=examples(120), **FUZZ)
@given(request=create_requests(), near=near_valid_specs(), use_near=st.booleans())
def test_create_job_with_generated_requests_answers_ok_or_a_typed_error(channel, request, near,
                                                                         use_near):
    stub = JobServiceStub(channel)
    if use_near:
        request.spec.CopyFrom(near)
    first = call("JobService/CreateJob", stub.CreateJob, request)
    _accepted(stub, first, request)
    if request.request_id:  # a retry with the same request_id: the same job or a typed error
        again = call("JobService/CreateJob", stub.CreateJob, request)
        if again is not None and first is not None:
            assert again.job_id == first.job_id


def test_create_job_fuzz_accepted_some_and_refused_some(channel):
    """The generators reach both sides of validation: the specs the two tests above
    draw, tallied on their own here (so it holds whichever tests ran before it)."""
    stub = JobServiceStub(channel)
    rpc = "JobService/CreateJob"
    before = collections.Counter(TALLY[rpc])

    @settings(max_examples=examples(120), **FUZZ)
    @given(spec=st.one_of(job_specs(), near_valid_specs(), near_valid_specs()))
    def create(spec: pb.JobSpec) -> None:
        call(rpc, stub.CreateJob, pb.CreateJobRequest(spec=spec))

    create()
    seen = TALLY[rpc] - before  # this test's own cases
    assert seen["OK"] > 0 and seen["INVALID_ARGUMENT"] > 0, dict(seen)


job_ids = st.one_of(names, st.sampled_from(["ncf", "cifar10"]), long_text)


@settings(max_examples=examples(60), **FUZZ)
@given(job_id=job_ids, op=st.sampled_from(["GetJob", "CancelJob", "DeleteJob"]))
def test_job_reads_and_writes_by_id_answer_ok_or_a_typed_error(channel, job_id, op):
    stub = JobServiceStub(channel)
    request = {"GetJob": pb.GetJobRequest, "CancelJob": pb.CancelJobRequest,
               "DeleteJob": pb.DeleteJobRequest}[op](job_id=job_id)
    call(f"JobService/{op}", getattr(stub, op), request)


page_tokens = st.one_of(texts, st.binary(max_size=40).map(lambda b: b.hex()),
                        st.integers(0, 2**70).map(lambda n: __import__("base64").urlsafe_b64encode(
                            f"seq:{n}".encode()).decode().rstrip("=")))


@settings(max_examples=examples(80), **FUZZ)
@given(page_size=u32, token=page_tokens, states=st.lists(i32_enum, max_size=10), tenant=names)
def test_list_jobs_answers_ok_or_a_typed_error(channel, page_size, token, states, tenant):
    stub = JobServiceStub(channel)
    request = pb.ListJobsRequest(page_size=page_size, page_token=token, states=states,
                                 tenant=tenant)
    out = call("JobService/ListJobs", stub.ListJobs, request)
    if out is not None:
        assert len(out.jobs) <= (page_size or 100)


def test_list_jobs_with_forty_thousand_state_filters_is_answered(channel):
    stub = JobServiceStub(channel)
    request = pb.ListJobsRequest(states=[pb.JOB_STATE_QUEUED] * 40_000)
    assert call("JobService/ListJobs", stub.ListJobs, request) is not None


def test_request_id_reused_for_another_job_id_is_a_conflict(channel):
    stub = JobServiceStub(channel)
    spec = _valid_spec("ncf")
    first = stub.CreateJob(pb.CreateJobRequest(spec=spec, job_id="idem-a", request_id="idem"))
    assert first.job_id == "idem-a"
    with pytest.raises(grpc.RpcError) as info:
        stub.CreateJob(pb.CreateJobRequest(spec=spec, job_id="idem-b", request_id="idem"))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS


LONG = "x" * 20_000


@pytest.mark.parametrize("case", ["CreateJob spec.name", "CreateJob job_id", "GetJob",
                                  "Connect register.node_id"])
def test_an_error_about_a_huge_field_still_arrives_typed(channel, case):
    spec = _valid_spec("ncf")
    if case == "CreateJob spec.name":
        spec.name = LONG
        fn = lambda: JobServiceStub(channel).CreateJob(  # noqa: E731
            pb.CreateJobRequest(spec=spec), timeout=10)
        want = grpc.StatusCode.INVALID_ARGUMENT
    elif case == "CreateJob job_id":
        fn = lambda: JobServiceStub(channel).CreateJob(  # noqa: E731
            pb.CreateJobRequest(spec=spec, job_id=LONG), timeout=10)
        want = grpc.StatusCode.INVALID_ARGUMENT
    elif case == "GetJob":
        fn = lambda: JobServiceStub(channel).GetJob(  # noqa: E731
            pb.GetJobRequest(job_id=LONG), timeout=10)
        want = grpc.StatusCode.NOT_FOUND
    else:
        reg = pb.AgentMessage(register=pb.Register(
            node_id=LONG, gpus=[pb.GpuInventory(gpu_type="rtx", count=1)]))
        fn = lambda: list(AgentServiceStub(channel).Connect(  # noqa: E731
            iter([reg]), timeout=10))
        want = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        fn()
    assert info.value.code() == want, info.value.details()


@pytest.mark.parametrize("char", ["x", "é", "\U0001F600", "\n"])
def test_an_error_echoing_a_long_multibyte_value_stays_under_the_metadata_limit(channel, char):
    """grpc-message percent-encodes every non-ASCII byte: clipping counts bytes."""
    with pytest.raises(grpc.RpcError) as info:
        ClusterServiceStub(channel).DrainNode(pb.DrainNodeRequest(node=char * 30_000),
                                              timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert field_of(info.value) == "node" and "chars]" in info.value.details()


def test_watch_from_a_revision_beyond_sqlite_integers_waits_for_changes(channel):
    """Regression (store.events_since): since_revision >= 2**63 was UNKNOWN
    (OverflowError binding it); no change is newer, so the watch just waits."""
    stub = JobServiceStub(channel)
    for since in (2**63, 2**64 - 1):
        with pytest.raises(grpc.RpcError) as info:
            list(stub.WatchJobs(pb.WatchJobsRequest(since_revision=since), timeout=0.5))
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


@settings(max_examples=examples(40), **FUZZ)
@given(limit=u32)
def test_cluster_reads_answer(channel, limit):
    stub = ClusterServiceStub(channel)
    call("ClusterService/GetCluster", stub.GetCluster, pb.GetClusterRequest())
    out = call("ClusterService/ListRounds", stub.ListRounds, pb.ListRoundsRequest(limit=limit))
    assert out is not None


@settings(max_examples=examples(40), **FUZZ)
@given(node=st.one_of(names, texts), reason=texts)
def test_drain_undrain_and_forget_answer_ok_or_a_typed_error(channel, node, reason):
    stub = ClusterServiceStub(channel)
    out = call("ClusterService/DrainNode", stub.DrainNode,
               pb.DrainNodeRequest(node=node, reason=reason))
    call("ClusterService/UndrainNode", stub.UndrainNode, pb.UndrainNodeRequest(node=node))
    if out is not None:  # a node the controller knows: drained, then ready again
        assert out.state == pb.NODE_STATE_DRAINING and out.name == node
    call("ClusterService/ForgetNode", stub.ForgetNode, pb.ForgetNodeRequest(node=node))


@st.composite
def optimize_requests(draw) -> pb.OptimizeRequest:
    req = pb.OptimizeRequest(policy=draw(st.one_of(
        st.sampled_from(["", "sia", "sia-plus", "pollux", "gavel", "fifo"]), texts)))
    types = ["rtx", "aws", draw(names)]
    for i in range(draw(st.integers(0, 3))):
        req.nodes.add(name=draw(st.one_of(st.just(f"n{i}"), names)),
                      gpu_type=draw(st.sampled_from(types)),
                      num_gpus=draw(st.one_of(st.integers(0, 8), u32)))
    for i in range(draw(st.integers(0, 3))):
        j = req.jobs.add(
            job_id=draw(st.one_of(st.just(f"j{i}"), names)), adaptivity=draw(i32_enum),
            min_gpus=draw(st.one_of(st.integers(0, 4), u32)),
            max_gpus=draw(st.one_of(st.integers(0, 8), u32)),
            num_gpus=draw(st.one_of(st.integers(0, 4), u32)),
            batch_size=draw(st.one_of(st.integers(0, 512), u32)),
            init_batch_size=draw(st.one_of(st.integers(0, 512), u32)),
            max_batch_size=draw(st.one_of(st.integers(0, 4096), u32)),
            pipeline_gpus=draw(st.integers(0, 4)), age_s=draw(doubles),
            restarts=draw(u32), restart_cost_s=draw(doubles), progress=draw(doubles),
            run_time_s=draw(doubles))
        j.allowed_gpu_types.extend(draw(st.lists(st.sampled_from(types), max_size=2)))
        for _ in range(draw(st.integers(0, 2))):
            j.type_batch_limits.add(gpu_type=draw(st.sampled_from(types)),
                                    min_local_batch_size=draw(st.integers(0, 64)),
                                    max_local_batch_size=draw(st.one_of(
                                        st.integers(0, 512), u32)))
        for _ in range(draw(st.integers(0, 3))):
            j.samples.add(gpu_type=draw(st.sampled_from(types)),
                          num_nodes=draw(st.integers(0, 3)),
                          num_replicas=draw(st.integers(0, 8)),
                          atomic_batch_size=draw(st.one_of(st.integers(0, 256), u32)),
                          accum_steps=draw(st.integers(0, 4)), step_time_s=draw(doubles),
                          sync_time_s=draw(doubles), count=draw(st.integers(0, 10)))
        if draw(st.booleans()):
            j.grad.sqr, j.grad.var = draw(doubles), draw(doubles)
    for _ in range(draw(st.integers(0, 2))):
        p = req.previous.add(job_id=draw(st.sampled_from(["j0", "j1", "x"])))
        if draw(st.booleans()):
            p.allocation.gpu_type = draw(st.sampled_from(types))
            p.allocation.num_gpus = draw(st.integers(0, 4))
            p.allocation.num_nodes = draw(st.integers(0, 2))
            for _ in range(draw(st.integers(0, 3))):
                p.allocation.gpus.add(node=draw(st.sampled_from(["n0", "n1", "zz"])),
                                      index=draw(st.one_of(st.integers(0, 8), u32)))
    return req


@settings(max_examples=examples(60), **FUZZ)
@given(request=optimize_requests())
def test_policy_optimize_answers_ok_or_a_typed_error(channel, request):
    stub = PolicyServiceStub(channel)
    out = call("PolicyService/Optimize", stub.Optimize, request, timeout=60)
    if out is not None:  # every GPU it hands out exists and goes to one job
        held: set = set()
        for d in out.decisions:
            for g in d.allocation.gpus:
                assert (g.node, g.index) not in held
                held.add((g.node, g.index))


@settings(max_examples=examples(30), **FUZZ)
@given(service=st.one_of(st.sampled_from(["", "sia.v1.JobService", "sia.v1.AgentService"]),
                         texts))
def test_health_check_answers(channel, service):
    stub = health_pb2_grpc.HealthStub(channel)
    call("grpc.health.v1.Health/Check", stub.Check, health_pb2.HealthCheckRequest(
        service=service))


@settings(max_examples=examples(25), **FUZZ)
@given(since=u64, job_id=st.one_of(st.just(""), names))
def test_watch_jobs_answers_events_or_a_typed_error(channel, since, job_id):
    """A watch blocks for changes: what it sends within 0.3 s, then the
    client's deadline. It must never fail with INTERNAL/UNKNOWN."""
    stub = JobServiceStub(channel)
    request = pb.WatchJobsRequest(since_revision=since, job_id=job_id)
    try:
        for ev in stub.WatchJobs(request, timeout=0.3):
            assert ev.revision > 0
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            record("JobService/WatchJobs", None)
            return
        check_answer("JobService/WatchJobs", err)
        return
    record("JobService/WatchJobs", None)


def test_watch_rounds_streams_until_the_deadline(channel):
    stub = ClusterServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.WatchRounds(pb.WatchRoundsRequest(), timeout=0.3))
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    record("ClusterService/WatchRounds", None)


# ---------------------------------------------------------------- (b) raw bytes


def _seeds() -> dict[str, tuple[type, list]]:
    spec = _valid_spec("cifar10")
    spec.labels["team"] = "a"
    spec.type_batch_limits.add(gpu_type="rtx", min_local_batch_size=1, max_local_batch_size=64)
    full = pb.JobSpec()
    full.CopyFrom(spec)
    full.allowed_gpu_types.extend(["rtx", "aws"])
    full.epochs = 2.5
    opt = pb.OptimizeRequest(policy="sia", nodes=[pb.NodeSpec(name="n0", gpu_type="rtx",
                                                               num_gpus=4)])
    j = opt.jobs.add(job_id="j0", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=2, batch_size=64)
    j.type_batch_limits.add(gpu_type="rtx", min_local_batch_size=1, max_local_batch_size=64)
    j.samples.add(gpu_type="rtx", num_nodes=1, num_replicas=1, atomic_batch_size=32,
                  step_time_s=0.1, sync_time_s=0.01, count=3)
    return {
        "/sia.v1.JobService/CreateJob": (pb.CreateJobRequest, [
            pb.CreateJobRequest(spec=spec), pb.CreateJobRequest(spec=full, request_id="r-1")]),
        "/sia.v1.JobService/GetJob": (pb.GetJobRequest, [pb.GetJobRequest(job_id="cifar10-x")]),
        "/sia.v1.JobService/ListJobs": (pb.ListJobsRequest, [pb.ListJobsRequest(
            page_size=5, states=[pb.JOB_STATE_QUEUED, pb.JOB_STATE_RUNNING], tenant="t")]),
        "/sia.v1.JobService/CancelJob": (pb.CancelJobRequest, [pb.CancelJobRequest(
            job_id="nope")]),
        "/sia.v1.JobService/DeleteJob": (pb.DeleteJobRequest, [pb.DeleteJobRequest(
            job_id="nope")]),
        "/sia.v1.ClusterService/GetCluster": (pb.GetClusterRequest, [pb.GetClusterRequest()]),
        "/sia.v1.ClusterService/ListRounds": (pb.ListRoundsRequest, [pb.ListRoundsRequest(
            limit=3)]),
        "/sia.v1.ClusterService/DrainNode": (pb.DrainNodeRequest, [pb.DrainNodeRequest(
            node="no-such-node", reason="maintenance")]),
        "/sia.v1.ClusterService/UndrainNode": (pb.UndrainNodeRequest, [pb.UndrainNodeRequest(
            node="no-such-node")]),
        "/sia.v1.ClusterService/ForgetNode": (pb.ForgetNodeRequest, [pb.ForgetNodeRequest(
            node="no-such-node")]),
        "/sia.v1.PolicyService/Optimize": (pb.OptimizeRequest, [opt]),
        "/grpc.health.v1.Health/Check": (health_pb2.HealthCheckRequest, [
            health_pb2.HealthCheckRequest(service="sia.v1.JobService")]),
    }


SEEDS = _seeds()


def _refused_undecodable(err: grpc.RpcError | None) -> bool:
    """gRPC's own answer to request bytes it cannot deserialize."""
    if err is None:
        return False
    if err.code() == grpc.StatusCode.UNKNOWN:
        return "DecodeError" in (err.details() or "")
    return err.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)


@pytest.mark.parametrize("method", sorted(SEEDS))
def test_mutated_raw_bytes_get_a_status_and_the_server_keeps_serving(channel, method):
    """Bit flips, truncations, junk and random bytes to one unary method. Bytes that
    still parse as the request must get OK or a typed error (as in (a)); bytes that
    do not never reach the servicer: grpc.aio refuses them itself (UNKNOWN "Unexpected
    DecodeError", its word for a request it cannot deserialize; sync gRPC says
    INTERNAL). A health check after every 50 cases and at the end."""
    rng = random.Random(f"{method}/{examples(1)}")
    kind, seeds = SEEDS[method]
    raw = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    rpc = method.lstrip("/").replace("sia.v1.", "")
    cases = examples(150)
    for k in range(cases):
        data = mutate(rng.choice(seeds).SerializeToString(), rng)
        try:
            parsed = kind.FromString(data)
        except Exception:
            parsed = None
        try:
            raw(data, timeout=60)
            err = None
        except grpc.RpcError as e:
            err = e
        if parsed is not None:
            allowed = TYPED | ({grpc.StatusCode.NOT_FOUND} if "Health" in method else set())
            check_answer(f"{rpc} (raw)", err, allowed)
        else:
            record(f"{rpc} (raw, unparseable)", None if err is None else err.code())
            assert _refused_undecodable(err), f"{method}: unparseable bytes answered {err}"
        if k % 50 == 49:
            healthy(channel)
    healthy(channel)


@pytest.mark.parametrize("method", ["/sia.v1.JobService/WatchJobs",
                                    "/sia.v1.ClusterService/WatchRounds"])
def test_mutated_raw_bytes_to_server_streams(channel, method):
    rng = random.Random(method)
    seed = (pb.WatchJobsRequest(since_revision=3, job_id="x") if "WatchJobs" in method
            else pb.WatchRoundsRequest()).SerializeToString()
    raw = channel.unary_stream(method, request_serializer=None, response_deserializer=None)
    kind = pb.WatchJobsRequest if "WatchJobs" in method else pb.WatchRoundsRequest
    rpc = method.lstrip("/").replace("sia.v1.", "") + " (raw)"
    for _ in range(examples(20)):
        data = mutate(seed, rng)
        try:
            kind.FromString(data)
            parsed = True
        except Exception:
            parsed = False
        try:
            for _ in raw(data, timeout=0.3):
                pass
            err = None
        except grpc.RpcError as e:
            err = e
        if not parsed:
            record(rpc.replace("(raw)", "(raw, unparseable)"), err and err.code())
            assert _refused_undecodable(err), err
            continue
        code = None if err is None else err.code()
        record(rpc, code)
        assert code in (None, grpc.StatusCode.DEADLINE_EXCEEDED, *TYPED), err
    healthy(channel)


def test_the_controller_survived_every_case(channel, served):
    healthy(channel)
    assert served.controller.status.value == "running"
    assert served.errors == []  # no event or action the controller had to skip
