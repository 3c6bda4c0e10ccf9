"""The agents' streams: one per node (a second agent with a live node's id is
refused), Register first, then messages in and directives out, until either side
ends it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import structlog

from sia_grpc import __version__
from sia_grpc.api import pb
from sia_grpc.api.convert import MAX_GPUS_PER_NODE
from sia_grpc.api.errors import (
    ApiError,
    invalid,
)
from sia_grpc.controller.machine import state as sm
from sia_grpc.controller.machine.validation import check_job_id
from sia_grpc.controller.shell.base import AgentStream, ShellBase
from sia_grpc.security import auth

log = structlog.get_logger("sia.controller")


class AgentStreams(ShellBase):
    """A part of `Controller`: the agents' streams (the module docstring)."""

    def _check_takeover(self, old: AgentStream, instance_id: str, new_peer: str) -> None:
        """May a new stream for `old.node_id` replace `old`? Yes for the same agent
        (its reconnect) and for a stream that ended or fell silent past the heartbeat
        timeout (a crashed agent must not lock its node out); otherwise this is a
        second agent with the node's id: ALREADY_EXISTS, and `old` is untouched."""
        if (instance_id and instance_id == old.instance_id) or old.context.done():
            return  # its own reconnect, or a stream that is over already
        silent = self.clock.time() - old.heard
        node, peer = old.node_id, old.peer
        if silent > self.config.heartbeat_timeout:
            log.warning("agent stream silent: replaced by a new one", node_id=node,
                        silent_s=round(silent, 1), old_peer=peer, peer=new_peer)
            return
        log.warning("second agent for a connected node refused", node_id=node,
                    connected=peer, refused=new_peer)
        raise ApiError(
            grpc.StatusCode.ALREADY_EXISTS,
            f"node {node!r} is already connected from {peer} (heard {silent:.0f} s ago): "
            f"a second agent with this node id is refused while that one is alive (give "
            f"this one another --node-id, or stop the other; it is replaced once silent for "
            f"{self.config.heartbeat_timeout:g} s)",
            reason="NODE_CONNECTED", metadata={"node": node, "peer": peer})

    async def agent_stream(self, requests, context) -> AsyncIterator[pb.ControllerMessage]:
        # The peer is read now, while the call is surely alive: gRPC's peer() on a
        # call the client has cancelled may read freed memory (a segfault seen in
        # the fuzz run; grpc/grpc#29927).
        peer = _peer(context)
        first = await anext(aiter(requests), None)
        if first is None:
            return
        reg = _registration(first)
        node = reg.node_id
        self._check_agent_term(node, reg.highest_term)  # (a restored store's term: refused)
        old = self._agents.get(node)
        if old is not None:
            self._check_takeover(old, reg.instance_id, peer)
            old.outbox.put_nowait(None)  # its own older stream, or a silent one: replaced
        agent = AgentStream(node, asyncio.Queue(), context, reg.instance_id, self.clock.time(),
                            peer)
        self._agents[node] = agent
        log.info("agent connected", node_id=node, gpu_type=reg.gpus[0].gpu_type,
                 gpus=reg.gpus[0].count)
        self._greeted().add(node)  # its next Register may carry our term
        agent.outbox.put_nowait(pb.ControllerMessage(registered=pb.Registered(
            controller_version=__version__, acks_carry_exits=True,
            # Agents keep real time; the interval is in the controller's clock.
            heartbeat_interval_s=self.config.heartbeat_interval / self.clock.rate)))
        await self.submit(sm.AgentRegistered(
            self.clock.time(), node, reg.gpus[0].gpu_type, reg.gpus[0].count, reg.agent_version,
            tuple((r.job_id, r.generation, tuple(r.local_gpus)) for r in reg.running),
            tuple((r.job_id, r.generation, r.local_gpu) for r in reg.profiling), reg.draining,
            reg.isolation))

        reader = asyncio.create_task(self._read(agent, requests), name=f"sia-agent-{node}")
        try:
            while True:
                msg = await agent.outbox.get()
                if msg is None or not self.leading:  # (a leader whose lease ran out sends nothing)
                    break
                msg.term = self.term  # the agent refuses a term lower than it has seen
                yield msg
            if reader.done() and not reader.cancelled():
                exc = reader.exception()
                if exc is not None and not isinstance(exc, grpc.aio.AioRpcError):
                    # An undecodable message: the agent is told, not left hanging.
                    log.warning("agent stream unreadable", node_id=node, error=repr(exc))
                    raise invalid("message", f"an AgentMessage could not be read: {exc!r}")
        finally:
            reader.cancel()
            await asyncio.wait([reader])  # its outcome was read above (or is moot)
            if self._agents.get(node) is agent:
                del self._agents[node]
                self.post(sm.AgentDisconnected(self.clock.time(), node))
                log.info("agent disconnected", node_id=node)


    async def _read(self, agent: AgentStream,
                    requests: AsyncIterator[pb.AgentMessage]) -> None:
        """An agent's messages, as events; the stream ends with its reader, however
        that ends."""
        try:
            async for msg in requests:
                agent.heard = self.clock.time()
                if msg.WhichOneof("kind") is None:
                    continue
                self.post(sm.AgentMessage(self.clock.time(), agent.node_id, msg))
        finally:
            agent.outbox.put_nowait(None)


def _registration(first: pb.AgentMessage) -> pb.Register:
    """The stream's first message, which must be a valid Register; INVALID_ARGUMENT
    naming the field otherwise."""
    if first.WhichOneof("kind") != "register":
        raise invalid("register", "the first message on the stream must be register")
    reg = first.register
    check_job_id(reg.node_id, "register.node_id")
    auth.check_node_id(reg.node_id)
    if len(reg.gpus) != 1 or reg.gpus[0].count == 0 or not reg.gpus[0].gpu_type:
        raise invalid("register.gpus", "one GPU type with a positive count per node")
    if reg.gpus[0].count > MAX_GPUS_PER_NODE:
        raise invalid("register.gpus[0].count", f"at most {MAX_GPUS_PER_NODE} GPUs per "
                      f"node, got {reg.gpus[0].count}")
    check_job_id(reg.gpus[0].gpu_type, "register.gpus[0].gpu_type")
    return reg


def _peer(context: grpc.aio.ServicerContext) -> str:
    """Where a stream comes from, e.g. "ipv4:10.0.0.3:51234" ("unknown" if gRPC cannot say)."""
    try:
        return context.peer() or "unknown"
    except Exception:  # a context without a transport (never expected on a live call)
        return "unknown"
