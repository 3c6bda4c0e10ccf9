"""Node-agent test support: a scripted controller (records every message the
agent sends, sends what the test pushes), configs and leak checks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from sia_grpc.api import AgentServiceServicer, pb
from sia_grpc.api.addresses import resolve as dns_resolve
from sia_grpc.emulation import AppTruth
from sia_grpc.nodeagent import AgentConfig, ManualClock, NodeAgent
from sia_grpc.testing.ports import free_port

WAIT_S = 5.0  # real seconds to wait for a message before failing


@dataclass(eq=False)
class Stream:
    """One Connect call as the controller sees it."""

    messages: list[pb.AgentMessage] = field(default_factory=list)
    outbox: asyncio.Queue[pb.ControllerMessage | None] = field(default_factory=asyncio.Queue)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    read_delay_s: float = 0.0  # a slow controller: real seconds before each read

    @property
    def register(self) -> pb.Register:
        return self.messages[0].register

    def of(self, kind: str, where: Callable[[Any], bool] = lambda m: True) -> list[Any]:
        return [getattr(m, kind) for m in self.messages
                if m.WhichOneof("kind") == kind and where(getattr(m, kind))]

    def index(self, kind: str, where: Callable[[Any], bool] = lambda m: True) -> int:
        """Position in the stream of the first `kind` message matching `where`."""
        return next(i for i, m in enumerate(self.messages)
                    if m.WhichOneof("kind") == kind and where(getattr(m, kind)))

    async def wait(self, kind: str, where: Callable[[Any], bool] = lambda m: True,
                   count: int = 1) -> list[Any]:
        """The `kind` messages matching `where`, once there are at least `count`."""
        async with asyncio.timeout(WAIT_S):
            while len(found := self.of(kind, where)) < count:
                self.changed.clear()
                await self.changed.wait()
        return found

    def send(self, **kind: Any) -> None:
        self.outbox.put_nowait(pb.ControllerMessage(**kind))

    def directive(self, **fields: Any) -> None:
        self.send(directive=pb.Directive(**fields))

    def drop(self) -> None:
        """End the stream from the controller's side."""
        self.outbox.put_nowait(None)


class ScriptedController(AgentServiceServicer):
    def __init__(self, heartbeat_interval_s: float = 1.0) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.streams: list[Stream] = []
        self.new_stream = asyncio.Event()
        self.refuse = 0  # abort this many coming streams with UNAVAILABLE, unregistered
        self.refuse_with: grpc.Status | None = None  # ...with this status instead
        self.term = 0  # ControllerMessage.term of Registered
        self.attempts = 0  # Connect calls, refused ones included
        self.acks_carry_exits = False  # Registered says it reads a STOP's exit in its ack

    async def stream(self, n: int = 0) -> Stream:
        """Stream number `n` (0-based), once its Register has arrived."""
        async with asyncio.timeout(WAIT_S):
            while len(self.streams) <= n:
                self.new_stream.clear()
                await self.new_stream.wait()
        return self.streams[n]

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        first = await context.read()
        self.attempts += 1
        if self.refuse:
            self.refuse -= 1
            if self.refuse_with is not None:
                await context.abort_with_status(self.refuse_with)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        assert first.WhichOneof("kind") == "register", first
        s = Stream(messages=[first])
        self.streams.append(s)
        self.new_stream.set()
        await context.write(pb.ControllerMessage(term=self.term, registered=pb.Registered(
            controller_version="test", heartbeat_interval_s=self.heartbeat_interval_s,
            acks_carry_exits=self.acks_carry_exits)))
        reader = asyncio.create_task(self._read(context, s))
        try:
            while (msg := await s.outbox.get()) is not None:
                await context.write(msg)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            s.ended.set()

    async def _read(self, context: grpc.aio.ServicerContext, s: Stream) -> None:
        while True:
            if s.read_delay_s:
                await asyncio.sleep(s.read_delay_s)
            if (msg := await context.read()) is grpc.aio.EOF:
                break
            s.messages.append(msg)
            s.changed.set()
        s.outbox.put_nowait(None)




def make_config(port: int, **kw: Any) -> AgentConfig:
    # time_scale 60: a modeled minute per clock second keeps the manual clock's
    # wake-ups (one per telemetry and heartbeat interval) few.
    fields: dict[str, Any] = dict(node_id="node-a", controller=f"127.0.0.1:{port}",
                                  gpu_type="rtx", num_gpus=8, time_scale=60.0,
                                  telemetry_interval_s=1.0, agent_version="test-1",
                                  close_grace_s=1.0)
    fields.update(kw)
    return AgentConfig(**fields)


def our_tasks() -> list[asyncio.Task[Any]]:
    """The agent's tasks still alive (all are named nodeagent:...), besides ours."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()
            and not t.done() and t.get_name().startswith("nodeagent")]


async def until(predicate: Callable[[], bool]) -> None:
    """Wait (real time, briefly) until `predicate()` holds."""
    async with asyncio.timeout(WAIT_S):
        while not predicate():
            await asyncio.sleep(0.002)


@contextlib.asynccontextmanager
async def started_agent(port: int, clock: ManualClock, *, backend: Any = None,
                        backoff: Callable[[int], float] = lambda attempt: 0.0,
                        resolve: Any = dns_resolve, **config: Any) -> AsyncIterator[NodeAgent]:
    """A started agent on the manual clock; closed, and checked for leaked tasks, after."""
    agent = NodeAgent(make_config(port, **config), backend, clock=clock, backoff=backoff,
                      resolve=resolve)
    await agent.start()
    try:
        yield agent
    finally:
        await agent.close()
    assert our_tasks() == []


SPEC = pb.JobSpec(name="c10", application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE)
# One node, two replicas of micro-batch 128 with one accumulation step: global batch 512.
ALLOC = pb.Allocation(gpu_type="rtx", num_gpus=2, num_nodes=1, num_replicas=2,
                      atomic_batch_size=128, accum_steps=1, batch_size=512)
SHAPE = ("rtx", 1, 2, 128, 1)  # progress_rate's (gpu_type, nodes, replicas, atomic, accum)


def run(directive_id: int, job_id: str = "job-1", generation: int = 1,
        gpus: tuple[int, ...] = (0, 1), restore: float = 0.0, **kw: Any) -> dict[str, Any]:
    """The fields of an ACTION_RUN directive (its world's master port a free one: the
    torch back-end's workers get it as MASTER_PORT)."""
    fields: dict[str, Any] = dict(
        round=1, directive_id=directive_id, job_id=job_id, generation=generation,
        action=pb.Directive.ACTION_RUN, spec=SPEC, local_gpus=list(gpus),
        world=pb.WorldLayout(world_size=len(gpus), rank_offset=0, master_addr="node-a",
                             master_port=free_port(), nodes=["node-a"]),
        allocation=ALLOC, restore_progress=restore)
    fields.update(kw)
    return fields


def stop(directive_id: int, job_id: str = "job-1", generation: int = 1) -> dict[str, Any]:
    return dict(round=2, directive_id=directive_id, job_id=job_id, generation=generation,
                action=pb.Directive.ACTION_STOP)


def expected_progress(app: AppTruth, restore: float, trained_s: float) -> float:
    """By hand: progress (units) after `trained_s` modeled seconds of training from
    fraction `restore`, at progress_rate's rate, which changes at epoch ends."""
    p = restore * app.max_progress
    for _, end in app.epoch_bounds():
        if p >= end:
            continue
        rate, _, _ = app.progress_rate(*SHAPE, p)
        if trained_s <= (end - p) / rate:
            return p + rate * trained_s
        trained_s -= (end - p) / rate
        p = end
    return app.max_progress


def expected_finish_s(app: AppTruth, restore: float) -> float:
    """By hand: modeled seconds from start to completion, restore delay included."""
    p, total = restore * app.max_progress, 0.0
    for _, end in app.epoch_bounds():
        if p < end:
            total += (end - p) / app.progress_rate(*SHAPE, p)[0]
            p = end
    return app.restart_delay + total
