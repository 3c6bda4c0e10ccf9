"""What the controller measures, besides the round span: the gauges (name, unit,
meaning, attributes), the reasons its counters are broken down by, the histogram
buckets of durations, and how a value becomes an OpenTelemetry attribute or
observation. `telemetry.Telemetry` makes the instruments from these; operators read
the same list in docs/operations.md.
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["DURATION_BUCKETS", "GAUGES", "GAUGE_KEYS", "PREEMPTION_REASONS",
           "RENEW_FAILURES", "attr_value"]

# Seconds: rounds are bounded by the 60 s interval, solves by their timeout (45 s by
# default: 40 and 45 show solves close to it).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
                    40.0, 45.0, 60.0, 120.0)

# The gauges, read through callables given to `Telemetry.observe(key=...)`:
# (name, key, unit, description, attribute of a per-value mapping, or a tuple of them
# for a mapping keyed by tuples, or None). With the
# Prometheus exporter "sia.queue.max_wait" (unit s) becomes sia_queue_max_wait_seconds,
# "sia.jobs" becomes sia_jobs{state=...}; docs/operations.md lists them all.
GAUGES: tuple[tuple[str, str, str, str, str | tuple[str, ...] | None], ...] = (
    ("sia.queue.length", "queue_length", "{job}",
     "Jobs waiting for GPUs (profiled, queued, holding none)", None),
    ("sia.queue.max_wait", "queue_max_wait", "s",
     "Longest wait of a job not yet started (PROFILING or QUEUED since submission)", None),
    ("sia.events.pending", "events_pending", "{event}",
     "Controller events not yet handled; growth means it is falling behind", None),
    ("sia.jobs", "jobs_by_state", "{job}", "Jobs by state (the CLI's names)", "state"),
    ("sia.nodes", "nodes_by_state", "{node}", "Nodes by state (READY, DRAINING, LOST)",
     "state"),
    # A node that separates nothing ("none") among a cluster's nodes should page.
    ("sia.nodes.isolation", "nodes_by_isolation", "{node}",
     "Nodes not LOST by how their agent separates jobs (none, user, sandbox; modeled: "
     "runs no job code; unknown: an agent too old to say)", "isolation"),
    ("sia.gpus.allocated", "gpus_allocated", "{gpu}", "GPUs held by jobs, by type",
     "gpu_type"),
    ("sia.gpus.capacity", "gpus_capacity", "{gpu}",
     "GPUs on ready nodes (connected, not draining), by type", "gpu_type"),
    ("sia.agents.connected", "agents_connected", "{agent}", "Connected node agents", None),
    ("sia.solve.timeout", "solve_timeout", "s",
     "The solve_timeout setting: a slower solve keeps the previous allocation", None),
    ("sia.queue.gpus.held", "queue_gpus_held", "{gpu}",
     "GPUs the jobs of each queue hold, by type", ("queue", "gpu_type")),
    ("sia.queue.gpus.guarantee", "queue_gpus_guarantee", "{gpu}",
     "GPUs each queue is guaranteed, by type", ("queue", "gpu_type")),
    ("sia.queue.gpus.borrowed", "queue_gpus_borrowed", "{gpu}",
     "GPUs each queue holds beyond its guarantee, by type", ("queue", "gpu_type")),
    ("sia.queue.jobs.pending", "queue_jobs_pending", "{job}",
     "Jobs of each queue waiting to start (PROFILING or QUEUED)", "queue"),
    # Summed over a controller pair: 1 (exactly one leader); 0 for longer than a lease's
    # TTL means no controller schedules.
    ("sia.leader", "leader", "",
     "1 while this controller acts as leader, 0 while it is a standby", None),
)
# Why a round preempted a job (the `reason` of sia.preemptions).
PREEMPTION_REASONS = ("reclaim", "policy")
# How a leader's lease renewal failed (the `reason` of sia.lease.renew_failures): the
# store call failed (retried), took too long (the leader steps down), or the store
# refused it (the lease expired or was taken: the leader steps down).
RENEW_FAILURES = ("error", "timeout", "refused")
GAUGE_KEYS = frozenset(key for _, key, _, _, _ in GAUGES)


def attr_value(value: Any) -> Any:
    """An OpenTelemetry attribute value (numpy scalars and the like coerced); None drops."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, list | tuple):
        items = [attr_value(v) for v in value if v is not None]
        return items if len({type(v) for v in items}) <= 1 else [str(v) for v in items]
    return str(value)
