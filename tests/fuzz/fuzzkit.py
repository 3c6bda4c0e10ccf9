"""Shared pieces of the fuzz tests: a real controller on an ephemeral loopback port
(in a thread with its own event loop, so the tests use plain blocking gRPC and
hypothesis), the tally of cases tried per RPC, the rule every answer must obey,
and the strategies that build hostile messages.

`SIA_FUZZ_EXAMPLES=N` multiplies every test's example / case count by N (default 1,
sized so `tests/fuzz` runs in well under a minute on two cores); `SIA_FUZZ_REPORT=
PATH` writes the tally as JSON at the end of the session.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import threading
from dataclasses import replace

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from hypothesis import strategies as st

from sia_grpc.api import pb
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.server import Controller

SCALE = max(1, int(os.environ.get("SIA_FUZZ_EXAMPLES", "1") or 1))


def examples(n: int) -> int:
    """The number of examples a test runs: its default `n`, times SIA_FUZZ_EXAMPLES."""
    return n * SCALE


# rpc -> status code name -> cases
TALLY: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

# Codes a request the server dislikes may get. Never INTERNAL or UNKNOWN.
TYPED = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
                   grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED,
                   grpc.StatusCode.FAILED_PRECONDITION})


def record(rpc: str, code: grpc.StatusCode | None) -> None:
    TALLY[rpc]["OK" if code is None or code == grpc.StatusCode.OK else code.name] += 1


def field_of(err: grpc.RpcError) -> str:
    """The field a failed call names: its google.rpc BadRequest detail, else ""."""
    status = rpc_status.from_call(err)
    if status is None:
        return ""
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            detail.Unpack(br)
            for v in br.field_violations:
                if v.field:
                    return v.field
    return ""


def check_answer(rpc: str, err: grpc.RpcError | None, allowed=TYPED) -> None:
    """OK or a typed error; INVALID_ARGUMENT must name the field (detail and message)."""
    record(rpc, None if err is None else err.code())
    if err is None:
        return
    code = err.code()
    assert code in allowed, f"{rpc}: {code.name}: {err.details()}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field = field_of(err)
        assert field, f"{rpc}: INVALID_ARGUMENT without a BadRequest field: {err.details()}"
        assert field.split("[")[0].split(".")[0] in (err.details() or "") or field in (
            err.details() or ""), f"{rpc}: the message does not name {field!r}"


class ThreadedController:
    """`with ThreadedController(config) as c:` a Controller serving on c.target."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-controller",
                                       daemon=True)
        self.controller: Controller | None = None

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> ThreadedController:
        self.thread.start()

        async def start() -> Controller:
            c = Controller(self.config)
            await c.start()
            return c
        self.controller = self.run(start())
        self._instrument(self.controller)
        return self

    def _instrument(self, c: Controller) -> None:
        """Record what the controller survives silently: an event its state machine
        raised on, or an action that failed (both are logged and skipped in production;
        here each is a bug)."""
        self.errors: list[str] = []
        handle, perform = c.state.handle, c._perform

        def checked_handle(event):
            try:
                return handle(event)
            except Exception as exc:
                self.errors.append(f"{type(event).__name__}: {exc!r}")
                raise

        def checked_perform(action):
            try:
                return perform(action)
            except Exception as exc:
                self.errors.append(f"{type(action).__name__}: {exc!r}")
                raise
        c.state.handle, c._perform = checked_handle, checked_perform

    def __exit__(self, *exc) -> None:
        async def stop() -> None:
            if self.controller is not None:
                await self.controller.close(grace=0.2)
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
        try:
            self.run(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.controller.port}"


def fuzz_config(tmp_dir) -> ControllerConfig:
    return replace(ControllerConfig(listen="127.0.0.1:0", db_path=str(tmp_dir / "fuzz.db"),
                                    store_synchronous="OFF", inline_solver=True))


def healthy(channel: grpc.Channel) -> None:
    """The controller still serves: health SERVING and a real read answered."""
    health = health_pb2_grpc.HealthStub(channel)
    resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    from sia_grpc.api import ClusterServiceStub

    ClusterServiceStub(channel).GetCluster(pb.GetClusterRequest(), timeout=10)


# ---------------------------------------------------------------- strategies

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "yolov3", "ncf")
NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

valid_names = st.text(NAME_CHARS, min_size=1, max_size=63).filter(lambda s: s[0] not in "._-")
long_text = st.text(max_size=8).map(lambda s: (s or "x") * 20_000)  # ~20 k to 160 k chars
texts = st.one_of(st.just(""), valid_names, st.text(max_size=80), long_text)
names = st.one_of(st.just(""), valid_names, valid_names, st.text(max_size=80), long_text)

u32 = st.one_of(st.integers(0, 16), st.integers(0, 2**32 - 1),
                st.sampled_from([2**16, 2**16 + 1, 2**24, 2**24 + 1, 2**31, 2**32 - 1]))
u64 = st.one_of(st.integers(0, 1000), st.integers(0, 2**64 - 1),
                st.sampled_from([2**48, 2**48 + 1, 2**63 - 1, 2**63, 2**64 - 1]))
i32_enum = st.one_of(st.integers(0, 4), st.integers(-(2**31), 2**31 - 1))
doubles = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e308, -1e308, 5e-324,
                                     float("nan"), float("inf"), float("-inf")]))


@st.composite
def job_specs(draw) -> pb.JobSpec:
    spec = pb.JobSpec(
        name=draw(names),
        application=draw(st.one_of(st.sampled_from(APPS), st.sampled_from(APPS), texts)),
        adaptivity=draw(i32_enum),
        min_gpus=draw(u32), max_gpus=draw(u32), num_gpus=draw(u32),
        batch_size=draw(u32), max_batch_size=draw(u32), pipeline_gpus=draw(u32),
        restart_cost_s=draw(doubles), tenant=draw(names))
    spec.command.extend(draw(st.lists(st.text(max_size=50), max_size=5)))
    if draw(st.integers(0, 20)) == 0:
        spec.command.extend(["x"] * draw(st.integers(250, 300)))
    spec.allowed_gpu_types.extend(draw(st.lists(names, max_size=4)))
    if draw(st.integers(0, 20)) == 0:
        spec.allowed_gpu_types.extend(["rtx"] * 70)
    for _ in range(draw(st.integers(0, 3))):
        spec.type_batch_limits.add(gpu_type=draw(names), min_local_batch_size=draw(u32),
                                   max_local_batch_size=draw(u32))
    target = draw(st.sampled_from(["none", "epochs", "samples"]))
    if target == "epochs":
        spec.epochs = draw(doubles)
    elif target == "samples":
        spec.samples = draw(u64)
    labels = draw(st.dictionaries(texts, st.one_of(texts, st.text(max_size=300)), max_size=4))
    if draw(st.integers(0, 20)) == 0:
        labels.update({f"k{i}": "v" for i in range(70)})
    spec.labels.update(labels)
    return spec


@st.composite
def create_requests(draw) -> pb.CreateJobRequest:
    return pb.CreateJobRequest(
        spec=draw(job_specs()), job_id=draw(names),
        request_id=draw(st.one_of(st.just(""), st.text(max_size=140), valid_names)))


# ---------------------------------------------------------------- raw bytes


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random corruption of a serialized message."""
    kind = rng.randrange(7)
    b = bytearray(data)
    if kind == 0 and b:  # flip 1..8 bits
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 1 and b:  # truncate
        del b[rng.randrange(len(b)):]
    elif kind == 2:  # random bytes, any length
        return rng.randbytes(rng.choice([1, 2, 5, 16, 64, 512, 4096]))
    elif kind == 3:  # insert junk in the middle
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.randbytes(rng.randint(1, 16))
    elif kind == 4 and b:  # overwrite a byte with a varint / wire-type edge
        b[rng.randrange(len(b))] = rng.choice([0x00, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x08])
    elif kind == 5:  # a field with a huge declared length
        b += bytes([0x0A, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) + rng.randbytes(8)
    else:  # the same message twice (a valid merge) plus junk
        b = b + b + rng.randbytes(rng.randint(0, 4))
    return bytes(b)
