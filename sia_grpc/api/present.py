"""How a person reads the wire's jobs, clusters and queues: GPUs, nodes, ages,
reasons, priority classes, GPU counts, times, a queue's guarantee and use, and the
`sia ls`, `sia cluster` and `sia queues` tables. One vocabulary for the `sia` command
line (`cli/jobs.py`, `cli/cluster.py`), the dashboard (`dashboard/render.py`) and the
demos, which all show these (as states: `api.state_name`), so none borrows from
another and no two say one thing differently. Pure functions of messages and numbers."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sia_grpc.api import node_state_name, pb, seconds, state_name

__all__ = ["UNITS", "QueueUse", "cluster_report", "format_age", "format_counts", "format_gpus",
           "format_nodes", "format_time", "job_age", "job_priority", "job_reason",
           "jobs_table", "queue_columns", "queue_guarantee", "queue_uses", "queues_table",
           "sorted_jobs", "table"]


def format_gpus(job: pb.Job) -> str:
    """"4×rtx" for a job holding four rtx GPUs, "-" for one holding none."""
    alloc = job.status.allocation
    return f"{alloc.num_gpus}×{alloc.gpu_type}" if alloc.num_gpus else "-"


def format_nodes(job: pb.Job) -> str:
    """The nodes the job's GPUs are on, in allocation order: "n0,n1"."""
    nodes = dict.fromkeys(g.node for g in job.status.allocation.gpus)
    return ",".join(nodes) or "-"


def format_age(seconds: float) -> str:
    """kubectl's AGE: "45s", "5m30s", "2h", "3d4h", "400d" (a negative age, a clock
    ahead of ours, is "0s")."""
    s = max(int(seconds), 0)
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y{d % 365}d" if d < 365 * 8 and d % 365 else f"{d // 365}y"


def job_age(job: pb.Job, now: float) -> str:
    """The job's AGE at `now` (seconds since the epoch), from its create time; "-"
    when it has none."""
    created = seconds(job.status.create_time)
    return format_age(now - created) if created else "-"


def job_reason(job: pb.Job) -> str:
    """Why the job is where it is, as a person reads it: its message, else its
    reason ("" for neither)."""
    return job.status.message or job.status.reason


def job_priority(job: pb.Job, default_priority: str | None) -> str:
    """The priority class the job is scheduled as, by name: its own, else the
    configured default class (`QueueConfig.default_priority`, "" read as "default"
    as the controller reads it). `None`: the configuration is not known, so "-"
    rather than a guess."""
    if job.spec.priority:
        return job.spec.priority
    return "-" if default_priority is None else default_priority or "default"


def format_counts(gpus: Any, extra: str = "", *, zeros: bool = False) -> str:
    """{"rtx": 8, "a100": 4} as "4 a100, 8 rtx" (zeros left out, unless `zeros`: a
    limit of 0 says something), then `extra`; "-" for nothing."""
    parts = [f"{n} {t}" for t, n in sorted(gpus.items()) if n or zeros]
    parts += [extra] if extra else []
    return ", ".join(parts) or "-"


def format_time(ts: Any) -> str:
    """A Timestamp as "2026-01-05T09:30:00Z" (UTC, whole seconds), "-" when unset."""
    if not ts.seconds and not ts.nanos:
        return "-"
    when = datetime.datetime.fromtimestamp(ts.seconds, datetime.UTC)
    return when.replace(tzinfo=None).isoformat() + "Z"


def table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """Left-aligned columns two spaces apart."""
    cells = [list(map(str, header)), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def sorted_jobs(jobs: Iterable[pb.Job]) -> list[pb.Job]:
    """Oldest first: by create time, then job id (jobs created in one instant)."""
    def key(job: pb.Job) -> tuple[int, int, str]:
        t = job.status.create_time
        return t.seconds, t.nanos, job.job_id
    return sorted(jobs, key=key)


@dataclass(frozen=True)
class _Context:
    """What a `sia ls` cell may need beside its job: the time AGE is measured at, and
    the configured default priority class (None: not known)."""

    now: float
    default_priority: str | None


# The `sia ls` columns: (header, only with -o wide, cell of a job in a `_Context`).
_JOB_COLUMNS: list[tuple[str, bool, Callable[[pb.Job, _Context], Any]]] = [
    ("ID", False, lambda j, c: j.job_id),
    ("NAME", False, lambda j, c: j.spec.name or "-"),
    ("TENANT", False, lambda j, c: j.spec.tenant or "-"),
    ("QUEUE", True, lambda j, c: j.spec.queue or "default"),
    ("PRIORITY", True, lambda j, c: job_priority(j, c.default_priority)),
    ("APPLICATION", True, lambda j, c: j.spec.application or "-"),
    ("STATE", False, lambda j, c: state_name(j.status.state)),
    ("GPUS", False, lambda j, c: format_gpus(j)),
    ("NODES", False, lambda j, c: format_nodes(j)),
    ("BATCH", True, lambda j, c: j.status.allocation.batch_size or "-"),
    ("PROGRESS", False, lambda j, c: f"{j.status.progress * 100:.0f}%"),
    ("GOODPUT", True, lambda j, c: f"{j.status.goodput:.3g}"),
    ("RESTARTS", False, lambda j, c: j.status.restarts),
    ("GENERATION", True, lambda j, c: j.status.generation),
    ("AGE", False, lambda j, c: job_age(j, c.now)),
    ("REASON", False, lambda j, c: job_reason(j)),
]


def jobs_table(jobs: Iterable[pb.Job], *, now: float, wide: bool = False,
               default_priority: str | None = None) -> str:
    """The `sia ls` table, oldest job first; AGE is from `now` (seconds since the
    epoch). `wide` adds the queue, priority class (`job_priority`, with the configured
    `default_priority`), application, batch size, goodput and generation."""
    columns = [(name, cell) for name, wide_only, cell in _JOB_COLUMNS if wide or not wide_only]
    context = _Context(now, default_priority)
    return table([name for name, _ in columns],
                 [[cell(job, context) for _, cell in columns] for job in sorted_jobs(jobs)])


def cluster_report(cluster: pb.Cluster, rounds: Iterable[pb.Round], *,
                   wide: bool = False) -> str:
    """`sia cluster`: GPUs by type, nodes with their allocation, and recent rounds
    (oldest first, with their start times). `wide` adds each node's agent version
    and last heartbeat, and each round's phases and end time."""
    out = [f"policy: {cluster.policy or '-'}  round: {cluster.round_duration_s:g}s", ""]
    out.append(table(["GPU TYPE", "NODES", "GPUS", "ALLOCATED", "FREE"],
                     [[t.gpu_type, t.nodes, t.gpus, t.allocated, t.gpus - t.allocated]
                      for t in cluster.types]))
    node_rows = []
    for n in cluster.nodes:
        jobs = dict.fromkeys(s.job_id for s in n.gpus if s.job_id)
        used = sum(1 for s in n.gpus if s.job_id)
        state = node_state_name(n.state)
        if n.drain_reason:
            state += f" ({n.drain_reason})"
        row: list[object] = [n.name, n.gpu_type, state, f"{used}/{n.num_gpus}",
                             n.isolation or "-"]
        row += [n.agent_version or "-", format_time(n.last_heartbeat)] if wide else []
        node_rows.append([*row, ",".join(jobs) or "-"])
    node_header = ["NODE", "TYPE", "STATE", "GPUS USED", "ISOLATION"]
    node_header += ["AGENT", "LAST HEARTBEAT"] if wide else []
    out += ["", table([*node_header, "JOBS"], node_rows), ""]
    rounds = list(rounds)
    if not rounds:
        out.append("no scheduling rounds yet")
        return "\n".join(out)
    header = ["ROUND", "START", "TRIGGER", "JOBS", "GPUS", "MOVED", "SOLVE MS", "TOTAL MS"]
    header += ["ESTIMATE MS", "PLACE MS", "DISPATCH MS", "OBJECTIVE", "END"] if wide else []
    rows = []
    for r in rounds:
        # A skipped round has no number (0): its NOTE says why it did not run.
        row = [r.round or "-", format_time(r.start_time), r.trigger or "-", r.jobs,
               r.gpus_allocated, r.jobs_moved, f"{r.solve_ms:.1f}", f"{r.total_ms:.1f}"]
        row += [f"{r.estimate_ms:.1f}", f"{r.place_ms:.1f}", f"{r.dispatch_ms:.1f}",
                f"{r.objective:.4g}", format_time(r.end_time)] if wide else []
        rows.append([*row, r.note])
    out.append(table([*header, "NOTE"], rows))
    return "\n".join(out)


# -- queues ------------------------------------------------------------------------------

UNITS = "units"  # a queue's use in units, against its type-flexible guarantee (QueueUse)


def queue_guarantee(spec: pb.QueueSpec) -> str:
    """"8 rtx", "4 units (any type)" (a type-flexible guarantee), "8 rtx, 4 units (any
    type)"; "-" for none."""
    units = f"{spec.guarantee_units:g} units (any type)" if spec.guarantee_units else ""
    return format_counts(spec.guarantee, units)


def queue_held(q: pb.QueueStatus) -> str:
    """"2 aws", and for a queue with a type-flexible guarantee what that is in units:
    "2 aws (2 units)"."""
    held = format_counts(q.held)
    return held + (f" ({q.held_units:g} units)" if q.spec.guarantee_units and q.held else "")


@dataclass(frozen=True)
class QueueUse:
    """What a queue holds of one GPU type (`key`), or in units against its
    type-flexible guarantee (`key` `UNITS`): `guarantee` None where it has none of
    that; `borrowed`, beyond its guarantee, as the controller counts it (a GPU that a
    type-flexible guarantee covers is not borrowed)."""

    key: str
    held: float
    guarantee: float | None
    borrowed: float = 0.0

    @property
    def text(self) -> str:
        """"2/8" (held of guaranteed), "2" (no guarantee of the type), "2/4 units"."""
        held = f"{self.held:g}" if self.guarantee is None else f"{self.held:g}/{self.guarantee:g}"
        return held + " units" * (self.key == UNITS)


def queue_uses(q: pb.QueueStatus) -> list[QueueUse]:
    """The queue's use by GPU type (those it holds or is guaranteed), then in units
    when it has a type-flexible guarantee."""
    s = q.spec
    uses = [QueueUse(t, q.held.get(t, 0), s.guarantee.get(t),
                     q.borrowed.get(t, 0)) for t in sorted({*s.guarantee, *q.held})]
    if s.guarantee_units:
        uses.append(QueueUse(UNITS, q.held_units, s.guarantee_units))
    return uses


def queue_columns(resp: pb.ListQueuesResponse) -> list[tuple[str, Callable[[pb.QueueStatus],
                                                                             Any]]]:
    """The queue table's columns, (header, cell of a queue), for `sia queues` and the
    dashboard alike: BORROWED only where some queue has a guarantee to borrow beyond,
    BORROW LIMIT only where some queue has one."""
    queues = list(resp.queues)
    columns: list[tuple[str, Callable[[pb.QueueStatus], Any]]] = [
        ("QUEUE", lambda q: q.spec.name), ("TENANTS", lambda q: ",".join(q.spec.tenants) or "*"),
        ("GUARANTEE", lambda q: queue_guarantee(q.spec)), ("HELD", queue_held)]
    if any(q.spec.guarantee or q.spec.guarantee_units for q in queues):
        columns.append(("BORROWED", lambda q: format_counts(q.borrowed)))
    if any(q.spec.borrow_limit for q in queues):
        columns.append(("BORROW LIMIT", lambda q: format_counts(q.spec.borrow_limit,
                                                                zeros=True)))
    return [*columns, ("PENDING", lambda q: q.pending_jobs),
            ("RUNNING", lambda q: q.running_jobs)]


def queues_table(resp: pb.ListQueuesResponse) -> str:
    """`sia queues`: each queue (`queue_columns`); then the priority classes and the
    preemption bounds."""
    columns = queue_columns(resp)
    out = [table([name for name, _ in columns],
                 [[cell(q) for _, cell in columns] for q in resp.queues])]
    cfg = resp.config
    classes = ", ".join(f"{c.name} ({c.weight:g})" for c in cfg.priority_class)
    out += ["", f"priority classes (weight): {classes or '-'}; default "
                f"{cfg.default_priority or 'default'}"]
    restarts = (cfg.max_restarts_per_round if cfg.HasField("max_restarts_per_round")
                else "no limit")
    out.append(f"preemption: minimum runtime {cfg.min_runtime_s:g}s; restarts per round: "
               f"{restarts}")
    return "\n".join(out)
