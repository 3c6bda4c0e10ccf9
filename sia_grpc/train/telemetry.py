"""Telemetry to the node agent: a small synchronous WorkerService client, the
table of measured step times it reports, when rank 0 reports, and what the library
itself costs (`Overheads`, logged and returned by `sia_grpc.train.overheads()`).

A report that fails (the agent restarting, a full queue) is logged and
dropped: training never stops for it, and the samples it carried go into the
next report. After a failure the next attempt waits twice as long (up to a
minute), so an absent agent costs next to nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import astuple, dataclass, field
from typing import Any, cast

from sia_grpc.api import WorkerServiceStub, pb

__all__ = ["AgentClient", "Overheads", "Reports", "SampleKey", "SampleTable"]

LOG = logging.getLogger(__name__)


class AgentClient:
    """Report(WorkerReport) -> WorkerReply over `unix:<socket>` (a node agent's), or
    to a gRPC `address` with a bearer `token` (the Slurm bridge's)."""

    def __init__(self, socket_path: str = "", timeout_s: float = 2.0, *, address: str = "",
                 token: str = "") -> None:
        import grpc

        self.address = f"unix:{socket_path}" if socket_path else address
        self._grpc = grpc
        self._channel = grpc.insecure_channel(self.address)
        self._stub = WorkerServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout_s = timeout_s
        self.failures = 0
        self.sent = 0
        self._retry_at = 0.0

    @classmethod
    def of(cls, env) -> AgentClient | None:
        """The client a worker's environment (`WorkerEnv`) names, or None: no agent."""
        if env.agent_socket:
            return cls(env.agent_socket, token=env.agent_token)
        if env.agent_address:
            return cls(address=env.agent_address, token=env.agent_token)
        return None

    def ready(self) -> bool:
        """False while backing off after a failure."""
        return time.monotonic() >= self._retry_at

    def report(self, report: pb.WorkerReport, *, force: bool = False) -> pb.WorkerReply | None:
        """The agent's reply, or None if the report did not get through."""
        if not force and not self.ready():
            return None
        try:
            reply = self._stub.Report(report, timeout=self.timeout_s, metadata=self._metadata)
        except Exception as e:  # RpcError mostly; nothing here may stop training
            self.failures += 1
            delay = min(60.0, 0.5 * 2 ** min(self.failures, 7))
            self._retry_at = time.monotonic() + delay
            if self.failures <= 3 or self.failures % 20 == 0:
                rpc = isinstance(e, self._grpc.RpcError)
                call = cast(Any, e)  # (a grpc.RpcError where `rpc`)
                LOG.warning("report to the agent at %s failed (%s: %s); training goes on",
                            self.address, call.code() if rpc else type(e).__name__,
                            call.details() if rpc else e)
            return None
        self.failures = 0
        self._retry_at = 0.0
        self.sent += 1
        return reply

    def close(self) -> None:
        self._channel.close()


@dataclass(frozen=True, order=True)
class SampleKey:
    gpu_type: str
    num_nodes: int
    num_replicas: int
    atomic_batch_size: int
    accum_steps: int


class SampleTable:
    """Per-shape sums of (count, step time, sync time): `pending` since the last
    successful report, `total` since the job began (checkpointed)."""

    def __init__(self) -> None:
        self.pending: dict[SampleKey, list[float]] = {}
        self.total: dict[SampleKey, list[float]] = {}

    def add(self, key: SampleKey, step_s: float, sync_s: float) -> None:
        sync_s = min(max(sync_s, 0.0), 0.999 * step_s)  # the model needs sync < step
        for table in (self.pending, self.total):
            acc = table.setdefault(key, [0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += step_s
            acc[2] += sync_s

    @staticmethod
    def _to_pb(table: dict[SampleKey, list[float]]) -> list[pb.ThroughputSample]:
        return [pb.ThroughputSample(
            gpu_type=k.gpu_type, num_nodes=k.num_nodes, num_replicas=k.num_replicas,
            atomic_batch_size=k.atomic_batch_size, accum_steps=k.accum_steps,
            step_time_s=s / n, sync_time_s=y / n, count=int(n))
            for k, (n, s, y) in sorted(table.items()) if n > 0 and s > 0]

    def take(self) -> tuple[list[pb.ThroughputSample], dict[SampleKey, list[float]]]:
        """The pending samples as protos, and the raw sums to `put_back` on failure."""
        raw, self.pending = self.pending, {}
        return self._to_pb(raw), raw

    def put_back(self, raw: dict[SampleKey, list[float]]) -> None:
        for k, (n, s, y) in raw.items():
            acc = self.pending.setdefault(k, [0, 0.0, 0.0])
            acc[0] += n
            acc[1] += s
            acc[2] += y

    def totals(self) -> list[pb.ThroughputSample]:
        return self._to_pb(self.total)

    def state_dict(self) -> dict:
        return {"total": [(list(astuple(k)), v) for k, v in self.total.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.total = {SampleKey(*k): list(v) for k, v in state.get("total", [])}


@dataclass
class Reports:
    """Rank 0's reports: where they go and when the last one went."""

    client: AgentClient | None   # None without an agent: nothing is reported
    interval_s: float
    last: float = 0.0            # time.monotonic() of the last attempt
    startup_s: float | None = None  # process start to the end of the first step
    startup_sent: bool = False   # a report carrying startup_s got through

    def due(self, now: float, steps: int) -> bool:
        """A periodic report is due (and the first after start-up as soon as can be)."""
        return self.client is not None and steps > 0 and (
            now - self.last >= self.interval_s or not self.startup_sent)

    def send(self, report: pb.WorkerReport, *, force: bool) -> pb.WorkerReply | None:
        """The agent's reply, None if the report did not get through."""
        assert self.client is not None
        reply = self.client.report(report, force=force)
        self.last = time.monotonic()
        if reply is not None and self.startup_s is not None:
            self.startup_sent = True
        return reply


@dataclass
class Overheads:
    """What the library itself costs, summed over this process's steps."""

    steps: int = 0
    step_s: float = 0.0         # wall time of optimizer steps (all micro-steps)
    agree_s: float = 0.0        # the per-step agreement all-reduce
    agrees: int = 0
    stats_s: float = 0.0        # gradient statistics: hooks + finalisation
    report_s: float = 0.0
    reports: int = 0
    checkpoint_save_s: list[float] = field(default_factory=list)
    restore_s: float = 0.0      # loading the checkpoint file
    startup_s: float = 0.0      # process start to the end of the first step

    def summary(self) -> dict[str, float]:
        n = max(self.steps, 1)
        step = self.step_s / n
        return {
            "steps": self.steps,
            "step_ms": 1e3 * step,
            "grad_stats_ms_per_step": 1e3 * self.stats_s / n,
            "grad_stats_fraction": self.stats_s / self.step_s if self.step_s else 0.0,
            "agreement_ms_per_step": 1e3 * self.agree_s / max(self.agrees, 1),
            "agreement_fraction": self.agree_s / self.step_s if self.step_s else 0.0,
            "report_ms_each": 1e3 * self.report_s / max(self.reports, 1),
            "checkpoint_save_ms_last": 1e3 * (self.checkpoint_save_s[-1]
                                              if self.checkpoint_save_s else 0.0),
            "checkpoint_restore_ms": 1e3 * self.restore_s,
            "startup_s": self.startup_s,
        }
