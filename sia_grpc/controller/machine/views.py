"""What the state machine shows: jobs, nodes and the cluster as the API returns them,
and the counts the metrics read (from another thread: they copy before iterating).

Changes: none."""

from __future__ import annotations

import collections
from typing import Any, cast

from sia_grpc.api import ISOLATION_LEVELS, OTHER_TENANT, node_state_name, pb, state_name
from sia_grpc.api.convert import queues_to_pb
from sia_grpc.controller.machine.books import StateBase
from sia_grpc.controller.machine.records import JobRec, NodeRec, timestamp
from sia_grpc.controller.machine.transitions import TERMINAL, WAITING
from sia_grpc.policy.queues import scheduled_in
from sia_grpc.policy.queues.outcome import borrowed, units


class Views(StateBase):
    """A part of `ControllerState`: what it shows (the module docstring)."""

    # The books the shell, the API and the tests read, by their short names (read
    # only: the parts reach them through their books, `books.StateBase`).

    @property
    def jobs(self) -> dict[str, JobRec]:
        return self.job_book.jobs

    @property
    def nodes(self) -> dict[str, NodeRec]:
        return self.node_book.nodes

    @property
    def drained(self) -> dict[str, str]:
        return self.node_book.drained

    @property
    def active_by_tenant(self) -> collections.Counter[str]:
        return self.job_book.active_by_tenant

    @property
    def round_no(self) -> int:
        return self.round_book.round_no

    @property
    def solving(self) -> int | None:
        return self.round_book.solving

    @property
    def refused(self) -> int:
        return self.directive_book.refused

    def job(self, job_id: str) -> pb.Job | None:
        rec = self.job_book.jobs.get(job_id)
        return rec.job if rec is not None else None

    def jobs_by_state(self) -> dict[str, int]:
        # Counted by number, then named once per state: naming each job's state made a
        # scrape of 10,000 jobs 2-4x slower.
        counts = collections.Counter(  # also read from the metrics thread
            rec.job.status.state for rec in list(self.job_book.jobs.values()))
        return {state_name(state): n for state, n in counts.items()}

    def gpus_allocated(self) -> dict[str, int]:
        nodes = list(self.node_book.nodes.values())  # also read from the metrics thread
        out = {n.gpu_type: 0 for n in nodes}
        for n in nodes:
            out[n.gpu_type] += len(n.holder)
        return out

    def gpus_capacity(self) -> dict[str, int]:
        """GPUs on READY nodes (the pool rounds place on, as `sia cluster` counts them),
        by type; a type whose nodes are all lost or draining stays, at 0."""
        out: dict[str, int] = {}
        for n in list(self.node_book.nodes.values()):  # also read from the metrics thread
            if n.gpu_type:  # (restored, its agent not back yet)
                ready = n.state == pb.NODE_STATE_READY
                out[n.gpu_type] = out.get(n.gpu_type, 0) + (n.num_gpus if ready else 0)
        return out

    def nodes_by_state(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in list(self.node_book.nodes.values()):  # also read from the metrics thread
            name = node_state_name(n.state)
            out[name] = out.get(name, 0) + 1
        return out

    def nodes_by_isolation(self) -> dict[str, int]:
        """Nodes not LOST by their agent's isolation level (every level, 0 included)."""
        out = dict.fromkeys(ISOLATION_LEVELS, 0)
        for n in list(self.node_book.nodes.values()):  # also read from the metrics thread
            if n.state != pb.NODE_STATE_LOST:
                level = n.isolation or "unknown"
                out[level] = out.get(level, 0) + 1
        return out

    def queue_max_wait(self, now: float) -> float:
        """Seconds since submission of the longest-waiting job that has never run
        (PROFILING or QUEUED, no start_time); 0 when there is none."""
        oldest = now
        for rec in list(self.job_book.jobs.values()):  # also read from the metrics thread
            status = rec.job.status
            if status.state in WAITING and not status.HasField("start_time"):
                created = status.create_time  # (its fields: ToNanoseconds is slower)
                oldest = min(oldest, created.seconds + created.nanos / 1e9)
        return max(now - oldest, 0.0)

    def queue_usage(self) -> tuple[dict[str, collections.Counter[str]],
                                   collections.Counter[str], collections.Counter[str]]:
        """Per queue (as scheduled: `scheduled_in`): the GPUs its jobs hold by type (the
        ledger's: passes included), its waiting jobs and its running ones. Also read
        from the metrics thread: it copies what it scans."""
        queues = self.queues
        jobs = dict(self.job_book.jobs)
        held: dict[str, collections.Counter[str]] = {q.name: collections.Counter()
                                                 for q in queues.queues}
        for n in list(self.node_book.nodes.values()):
            for job_id in list(n.holder.values()):
                rec = jobs.get(job_id)
                if rec is not None and n.gpu_type:
                    held[scheduled_in(queues, rec.job.spec)[0]][n.gpu_type] += 1
        pending: collections.Counter[str] = collections.Counter()
        running: collections.Counter[str] = collections.Counter()
        for rec in jobs.values():
            state = rec.job.status.state
            if state not in TERMINAL:
                queue = scheduled_in(queues, rec.job.spec)[0]
                if state in WAITING:
                    pending[queue] += 1
                else:
                    running[queue] += 1
        return held, pending, running

    def queue_metrics(self) -> dict[str, dict[Any, int]]:
        """The per-queue gauges: "held", "guarantee" and "borrowed" by (queue, GPU type),
        every queue and type the cluster or a guarantee names, 0 included; "pending" by
        queue."""
        queues = self.queues
        held, pending, _ = self.queue_usage()
        types = set(self.gpus_capacity()) | {t for q in queues.queues for t in q.guarantee}
        out: dict[str, dict[Any, int]] = {"held": {}, "guarantee": {}, "borrowed": {},
                                "pending": {q.name: pending[q.name] for q in queues.queues}}
        for q in queues.queues:
            over = borrowed(queues, q.name, held[q.name])
            for t in sorted(types):
                out["held"][q.name, t] = held[q.name][t]
                out["guarantee"][q.name, t] = q.guarantee.get(t, 0)
                out["borrowed"][q.name, t] = over.get(t, 0)
        return out

    def queues_pb(self) -> pb.ListQueuesResponse:
        """Every queue, with its guarantee, what it holds and borrows, its jobs."""
        queues = self.queues
        held, pending, running = self.queue_usage()
        out = pb.ListQueuesResponse(config=queues_to_pb(queues))
        for q, spec in zip(queues.queues, out.config.queue, strict=True):
            mine = held[q.name]
            out.queues.add(spec=spec, held=dict(mine), borrowed=borrowed(queues, q.name, mine),
                           held_units=units(queues, mine), pending_jobs=pending[q.name],
                           running_jobs=running[q.name])
        return out

    def node_pb(self, name: str, tenant: str | None = None) -> pb.Node:
        """A node as `GetCluster` shows it; for `tenant` (a caller who is not an
        admin) another tenant's job ids are hidden (docs/security.md)."""
        n = self.node_book.nodes[name]
        node = pb.Node(name=n.name, gpu_type=n.gpu_type, num_gpus=n.num_gpus,
                       state=cast("pb.NodeState", n.state),
                       agent_version=n.version, drain_reason=self.node_book.drained.get(n.name, ""),
                       isolation=n.isolation)
        node.last_heartbeat.CopyFrom(timestamp(n.last_seen))
        for g in range(n.num_gpus):
            job_id = n.holder.get(g, "")
            if job_id and tenant is not None:
                rec = self.job_book.jobs.get(job_id)
                if rec is None or rec.job.spec.tenant != tenant:
                    job_id = OTHER_TENANT
            node.gpus.add(index=g, job_id=job_id)
        return node

    def cluster_pb(self, tenant: str | None = None) -> pb.Cluster:
        c = pb.Cluster()
        types: dict[str, pb.GpuTypeSummary] = {}
        for n in sorted(self.node_book.nodes.values(), key=lambda n: (n.gpu_type, n.name)):
            c.nodes.append(self.node_pb(n.name, tenant))
            if not n.gpu_type:  # (restored, its agent not back yet)
                continue
            s = types.setdefault(n.gpu_type, pb.GpuTypeSummary(gpu_type=n.gpu_type))
            if n.state == pb.NODE_STATE_READY:
                s.nodes += 1
                s.gpus += n.num_gpus
                s.allocated += len(n.holder)
        c.types.extend(types.values())
        return c


def round_for(rnd: pb.Round, tenant: str | None) -> pb.Round:
    """A round as a caller of `tenant` (None: an admin) may see it: another tenant's
    moved jobs named only "(other tenant)", as GetCluster names their GPUs."""
    if tenant is None or all(m.tenant == tenant for m in rnd.moves):
        return rnd
    out = pb.Round()
    out.CopyFrom(rnd)
    for m in out.moves:
        if m.tenant != tenant:
            m.job_id, m.name, m.tenant = OTHER_TENANT, "", ""
    return out
