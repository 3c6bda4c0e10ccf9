"""Fuzz AgentService.Connect: streams of malformed, out-of-order and duplicated
AgentMessages (telemetry for unknown jobs, acks for unknown directives, register
twice, a non-register first message, NaN and huge fields, raw bytes). The
controller ends or keeps each stream cleanly, its state machine never raises, its
books stay within capacity, and a well-behaved agent on the side is never
disturbed."""

from __future__ import annotations

import random

import grpc
import pytest
from fuzzkit import (
    TYPED,
    ThreadedController,
    check_answer,
    doubles,
    examples,
    field_of,
    fuzz_config,
    healthy,
    i32_enum,
    mutate,
    names,
    record,
    texts,
    u32,
    u64,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sia_grpc.api import AgentServiceStub, ClusterServiceStub, JobServiceStub, pb
from sia_grpc.nodeagent import AgentConfig, AgentStatus, NodeAgent

FUZZ = dict(deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                   HealthCheck.function_scoped_fixture])
KNOWN_JOBS = ("fz-job-0", "fz-job-1", "fz-job-2")
NODES = ("fz-0", "fz-1", "fz-2")


@pytest.fixture(scope="module")
def world(served, channel):
    """Three known jobs and a well-behaved agent that must never be disturbed."""
    jobs = JobServiceStub(channel)
    for job_id in KNOWN_JOBS:
        jobs.CreateJob(pb.CreateJobRequest(job_id=job_id, spec=pb.JobSpec(
            name="ncf", application="ncf", adaptivity=pb.ADAPTIVITY_ADAPTIVE)))

    async def start() -> NodeAgent:
        agent = NodeAgent(AgentConfig(node_id="good-0", controller=served.target,
                                      gpu_type="rtx", num_gpus=4, time_scale=50.0,
                                      telemetry_interval_s=0.2))
        await agent.start()
        return agent
    agent = served.run(start())
    import time

    deadline = time.monotonic() + 20
    while agent.registrations < 1:
        assert time.monotonic() < deadline, "the good agent never registered"
        time.sleep(0.02)
    yield agent
    served.run(agent.close())


job_ids = st.one_of(st.sampled_from(KNOWN_JOBS), st.sampled_from(KNOWN_JOBS), names)
small_u64 = st.one_of(st.integers(0, 3), u64)


@st.composite
def registers(draw, node=None) -> pb.AgentMessage:
    reg = pb.Register(node_id=node or draw(st.one_of(st.sampled_from(NODES), names)),
                      agent_version=draw(texts))
    for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2]))):
        reg.gpus.add(gpu_type=draw(st.one_of(st.sampled_from(["rtx", "aws"]), names)),
                     count=draw(st.one_of(st.integers(0, 8), st.integers(0, 64))))
    for _ in range(draw(st.integers(0, 3))):
        reg.running.add(job_id=draw(job_ids), generation=draw(small_u64),
                        local_gpus=draw(st.lists(st.one_of(st.integers(0, 9), u32),
                                                 max_size=4)))
    return pb.AgentMessage(register=reg)


@st.composite
def samples(draw) -> pb.ThroughputSample:
    return pb.ThroughputSample(
        gpu_type=draw(st.one_of(st.sampled_from(["rtx", "aws"]), names)),
        num_nodes=draw(st.one_of(st.integers(0, 3), u32)),
        num_replicas=draw(st.one_of(st.integers(0, 8), u32)),
        atomic_batch_size=draw(st.one_of(st.integers(0, 512), u32)),
        accum_steps=draw(st.one_of(st.integers(0, 4), u32)),
        step_time_s=draw(doubles), sync_time_s=draw(doubles),
        count=draw(st.integers(0, 10)))


@st.composite
def job_exits(draw) -> pb.JobExit:
    return pb.JobExit(job_id=draw(job_ids), generation=draw(small_u64), kind=draw(i32_enum),
                      progress=draw(doubles), message=draw(texts))


@st.composite
def other_messages(draw) -> pb.AgentMessage:
    kind = draw(st.sampled_from(["heartbeat", "telemetry", "telemetry", "ack", "exit",
                                 "register", "empty"]))
    if kind == "heartbeat":
        return pb.AgentMessage(heartbeat=pb.Heartbeat())
    if kind == "empty":
        return pb.AgentMessage()
    if kind == "register":
        return draw(registers())
    if kind == "ack":  # (with a STOP's exit inside it, or not: `acks_carry_exits`)
        return pb.AgentMessage(ack=pb.DirectiveAck(
            directive_id=draw(u64), job_id=draw(job_ids), generation=draw(small_u64),
            ok=draw(st.booleans()), error=draw(texts),
            exit=draw(st.one_of(st.none(), job_exits()))))
    if kind == "exit":
        return pb.AgentMessage(exit=draw(job_exits()))
    t = pb.Telemetry(job_id=draw(job_ids), generation=draw(small_u64),
                     progress=draw(doubles), profile=draw(st.booleans()),
                     samples=draw(st.lists(samples(), max_size=3)))
    if draw(st.booleans()):
        t.grad.sqr, t.grad.var = draw(doubles), draw(doubles)
    if draw(st.booleans()):
        t.checkpoint.generation = draw(small_u64)
        t.checkpoint.progress = draw(doubles)
        t.checkpoint.save_s = draw(doubles)
        t.checkpoint.restore_s = draw(doubles)
        t.checkpoint.path = draw(texts)
    return pb.AgentMessage(telemetry=t)


@st.composite
def streams(draw) -> list[pb.AgentMessage]:
    first = draw(st.one_of(registers(), registers(node=draw(st.sampled_from(NODES))),
                           other_messages()))
    rest = draw(st.lists(other_messages(), max_size=12))
    out = [first, *rest]
    if out and draw(st.booleans()):  # duplicates, in a shuffled order
        dups = draw(st.lists(st.sampled_from(out), max_size=6))
        out = [first, *draw(st.permutations(rest + dups))]
    return out


def _books_balance(channel) -> None:
    """What GetCluster says: no type has more GPUs allocated than it has; every
    slot is a real GPU of its node."""
    cluster = ClusterServiceStub(channel).GetCluster(pb.GetClusterRequest(), timeout=10)
    for t in cluster.types:
        assert t.allocated <= t.gpus, f"{t.gpu_type}: {t.allocated} of {t.gpus} allocated"
    for n in cluster.nodes:
        assert len(n.gpus) == n.num_gpus


@settings(max_examples=examples(80), **FUZZ)
@given(messages=streams())
def test_malformed_agent_streams_end_cleanly_and_others_keep_being_served(
        served, channel, world, messages):
    stub = AgentServiceStub(channel)
    first_is_register = messages[0].WhichOneof("kind") == "register"
    try:
        replies = list(stub.Connect(iter(messages), timeout=10))
        err = None
    except grpc.RpcError as e:
        err = e
        replies = []
    check_answer("AgentService/Connect", err)
    if err is not None:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "register" in field_of(err)
    if not first_is_register:
        assert err is not None
    if replies:
        assert replies[0].WhichOneof("kind") == "registered"
    assert served.errors == [], served.errors
    _books_balance(channel)
    assert world.status is AgentStatus.REGISTERED and world.registrations == 1


def test_raw_bytes_on_the_agent_stream(served, channel, world):
    """Corrupt AgentMessage bytes, after a valid register or first."""
    rng = random.Random("connect")
    raw = channel.stream_stream("/sia.v1.AgentService/Connect", request_serializer=None,
                                response_deserializer=None)
    reg = pb.AgentMessage(register=pb.Register(
        node_id="fz-raw", gpus=[pb.GpuInventory(gpu_type="rtx", count=2)])).SerializeToString()
    seeds = [reg, pb.AgentMessage(telemetry=pb.Telemetry(
        job_id=KNOWN_JOBS[0], progress=0.5, samples=[pb.ThroughputSample(
            gpu_type="rtx", num_nodes=1, num_replicas=1, atomic_batch_size=8,
            step_time_s=0.1)])).SerializeToString(),
        pb.AgentMessage(ack=pb.DirectiveAck(directive_id=7, ok=True)).SerializeToString()]
    for k in range(examples(60)):
        msgs = [mutate(rng.choice(seeds), rng) for _ in range(rng.randint(1, 4))]
        if k % 2:
            msgs.insert(0, reg)
        try:
            list(raw(iter(msgs), timeout=10))
            code = None
        except grpc.RpcError as e:
            code = e.code()
            assert code in (*TYPED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (
                k, [_parses(m) for m in msgs], e)
            if code == grpc.StatusCode.UNKNOWN:
                assert "DecodeError" in (e.details() or ""), e  # never the servicer's crash
        record("AgentService/Connect (raw)", code)
    assert served.errors == []
    healthy(channel)
    _books_balance(channel)
    assert world.status is AgentStatus.REGISTERED and world.registrations == 1


def _parses(data: bytes) -> bool:
    try:
        pb.AgentMessage.FromString(data)
    except Exception:
        return False
    return True


def _registers(data: bytes) -> bool:
    return _parses(data) and pb.AgentMessage.FromString(data).WhichOneof("kind") == "register"


def test_an_undecodable_message_after_register_ends_the_stream_promptly(served, channel):
    raw = channel.stream_stream("/sia.v1.AgentService/Connect", request_serializer=None,
                                response_deserializer=None)
    reg = pb.AgentMessage(register=pb.Register(
        node_id="fz-corrupt", gpus=[pb.GpuInventory(gpu_type="rtx", count=1)]))
    with pytest.raises(grpc.RpcError) as info:
        list(raw(iter([reg.SerializeToString(), b"\x0a\xff\xff\xff\xff\x0f"]), timeout=3))
    assert info.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED
    assert "fz-corrupt" not in served.controller.agents


def test_register_with_an_absurd_gpu_count_is_refused(tmp_path):
    # A controller of its own: the node it accepts would make GetCluster unanswerable.
    with ThreadedController(fuzz_config(tmp_path)) as c, \
            grpc.insecure_channel(c.target) as ch:
        reg = pb.AgentMessage(register=pb.Register(
            node_id="fz-huge", gpus=[pb.GpuInventory(gpu_type="rtx", count=2**32 - 1)]))
        with pytest.raises(grpc.RpcError) as info:
            list(AgentServiceStub(ch).Connect(iter([reg]), timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
