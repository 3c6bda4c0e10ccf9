"""The paper's evaluation metrics, computed from one run's records (`sim.records`).

Definitions (Sia, SOSP '23, §5):

* JCT: finish − submit of each *finished* job; average and p99 (numpy's linear
  percentile) in hours.
* Makespan: first submission to last finish. If some jobs never finished, the run
  was cut short and the makespan runs to the last round's start time instead (or
  the last finish, if later); `finished < jobs` says so.
* GPU hours per job: Σ gpu_seconds over all jobs / 3600 / number of jobs.
* Restarts per job: mean checkpoint-restarts over all jobs.
* Contention: number of active jobs (submitted, not finished) per round; mean and max.
* Finish-time fairness: ρ = JCT / isolated JCT for each job that has both; the worst
  (largest) ρ, and the share of those jobs with ρ > 1 ("unfair jobs").
* Policy time: wall time of the policy call per round, median and p95 in ms.

A field is None where it is undefined (no jobs, none finished, no rounds, ...);
nothing here returns NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from sia_grpc.policy.queues.measures import compute_queues
from sia_grpc.sim.records import JobRecord, QueueSpec, RoundRecord, SimResult, round_length

__all__ = [
    "Metrics",
    "compute",
    "finished_jcts_h",
    "format_table",
    "from_json",
    "rhos",
    "summarize",
    "to_json",
]

_HOUR = 3600.0


@dataclass(frozen=True)
class Metrics:
    jobs: int
    finished: int
    avg_jct_h: float | None
    p99_jct_h: float | None
    makespan_h: float | None
    gpu_hours_per_job: float | None
    restarts_per_job: float | None
    contention_mean: float | None
    contention_max: int | None
    ftf_worst: float | None
    unfair_fraction: float | None
    policy_ms_median: float | None
    policy_ms_p95: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def finished_jcts_h(result: SimResult) -> list[float]:
    """JCTs (hours) of the run's finished jobs, in job order."""
    return [j.jct / _HOUR for j in result.jobs if j.jct is not None]


def _rho(job: JobRecord) -> float | None:
    jct = job.jct
    iso = job.isolated_jct
    if jct is None or iso is None or not iso > 0 or not math.isfinite(iso):
        return None
    return jct / iso


def rhos(result: SimResult) -> list[float]:
    """Finish-time fairness ρ = JCT / isolated JCT of every job that has both."""
    return [r for r in (_rho(j) for j in result.jobs) if r is not None]


def _f(x: Any) -> float:
    return float(x)


def compute(result: SimResult) -> Metrics:
    jobs = result.jobs
    n = len(jobs)
    jcts = np.asarray(finished_jcts_h(result), dtype=float)
    finished = int(jcts.size)

    avg_jct = _f(jcts.mean()) if finished else None
    p99_jct = _f(np.percentile(jcts, 99)) if finished else None

    makespan = None
    if n:
        start = min(j.submit_time for j in jobs)
        ends = [j.finish_time for j in jobs if j.finish_time is not None]
        if finished < n and result.rounds:
            ends.append(result.rounds[-1].time)
        if ends:
            makespan = max(0.0, max(ends) - start) / _HOUR

    gpu_h = _f(sum(j.gpu_seconds for j in jobs) / _HOUR / n) if n else None
    restarts = _f(sum(j.restarts for j in jobs) / n) if n else None

    rounds = result.rounds
    active = np.asarray([r.active_jobs for r in rounds], dtype=float)
    cont_mean = _f(active.mean()) if rounds else None
    cont_max = int(active.max()) if rounds else None

    rho = np.asarray(rhos(result), dtype=float)
    ftf_worst = _f(rho.max()) if rho.size else None
    unfair = _f((rho > 1.0).mean()) if rho.size else None

    ms = np.asarray([r.policy_seconds for r in rounds], dtype=float) * 1e3
    pol_med = _f(np.median(ms)) if rounds else None
    pol_p95 = _f(np.percentile(ms, 95)) if rounds else None

    return Metrics(
        jobs=n,
        finished=finished,
        avg_jct_h=avg_jct,
        p99_jct_h=p99_jct,
        makespan_h=makespan,
        gpu_hours_per_job=gpu_h,
        restarts_per_job=restarts,
        contention_mean=cont_mean,
        contention_max=cont_max,
        ftf_worst=ftf_worst,
        unfair_fraction=unfair,
        policy_ms_median=pol_med,
        policy_ms_p95=pol_p95,
    )


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Metrics))


def summarize(results: Sequence[Metrics]) -> dict[str, tuple[float, float]]:
    """Mean and population std (ddof=0) of every field across runs (workloads).

    Runs where a field is None are left out of that field; a field that is None in
    every run is left out of the summary."""
    out: dict[str, tuple[float, float]] = {}
    for name in FIELDS:
        vals = [getattr(m, name) for m in results]
        arr = np.asarray([v for v in vals if v is not None], dtype=float)
        if arr.size:
            out[name] = (_f(arr.mean()), _f(arr.std(ddof=0)))
    return out


# (field, header, decimals) of the table's columns.
_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("jobs", "jobs", 0),
    ("finished", "done", 0),
    ("avg_jct_h", "avg JCT h", 2),
    ("p99_jct_h", "p99 JCT h", 2),
    ("makespan_h", "makespan h", 2),
    ("gpu_hours_per_job", "GPU h/job", 2),
    ("restarts_per_job", "restarts/job", 2),
    ("contention_mean", "contention", 1),
    ("contention_max", "max cont.", 0),
    ("ftf_worst", "worst FTF", 2),
    ("unfair_fraction", "unfair", 2),
    ("policy_ms_median", "policy ms p50", 1),
    ("policy_ms_p95", "policy ms p95", 1),
)


def _cell(value: Any, decimals: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        mean, std = value
        d = decimals or 1  # a mean of counts isn't a count
        return f"{mean:.{d}f} ± {std:.{d}f}"
    return f"{value:.{decimals}f}"


# The columns of the per-queue table (`policy.queues.measures.QueueMetrics`).
QUEUE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("jobs", "jobs", 0),
    ("finished", "done", 0),
    ("avg_jct_h", "avg JCT h", 2),
    ("p99_jct_h", "p99 JCT h", 2),
    ("gpu_hours", "GPU h", 1),
    ("guarantee_violation_gpu_h", "violation GPU h", 2),
    ("shortfall_gpu_h", "shortfall GPU h", 2),
    ("violation_waiting_gpu_h", "while waiting", 2),
    ("reclaim_s", "reclaim s", 0),
    ("reclaim_restarts", "gave way", 0),
)


def format_table(rows: Mapping[str, Any], label: str = "",
                 columns: Sequence[tuple[str, str, int]] = _COLUMNS) -> str:
    """An aligned text table, one row per key (policy or workload).

    A row is a `Metrics` (plain numbers; or another metrics dataclass, with its
    `columns`) or a `summarize` dict (cells "mean ± std"; a plain number in such a
    dict is shown as is). Undefined cells show "-"."""
    header = [label or "name"] + [h for _, h, _ in columns]
    body: list[list[str]] = []
    for key, row in rows.items():
        get = row.get if isinstance(row, Mapping) else (lambda f, r=row: getattr(r, f))
        body.append([str(key)] + [_cell(get(f), d) for f, _, d in columns])
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep, *(line(r) for r in body)])


def _num(x: float | None) -> float | None:
    """A JSON-safe float: None for None, NaN and infinities."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _plain_metrics(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (_num(v) if isinstance(v, float) else v) for k, v in values.items()}


def to_json(result: SimResult, metrics: Metrics, *, rounds: bool = True) -> dict[str, Any]:
    """The run and its metrics as plain JSON-able data (dicts, lists, str, int, float,
    None; no NaN). `rounds=False` leaves out the per-round records. A run with
    queues adds their configuration and `metrics.queues.<name>` (`policy.queues.measures`)."""
    out: dict[str, Any] = {
        "workload": result.workload,
        "policy": result.policy,
        "params": dict(result.params),
        "settings": dict(result.settings),
        "cluster": result.cluster,
        "capacity": {str(k): int(v) for k, v in result.capacity.items()},
        "wall_seconds": _num(result.wall_seconds),
        "cpu_seconds": _num(result.cpu_seconds),
        "round_seconds": _num(result.round_seconds),
        "metrics": _plain_metrics(metrics.as_dict()),
        "jobs": [_job_json(j) for j in result.jobs],
    }
    if result.queues:
        out.update(_queues_json(result))
        per_queue = compute_queues(result, round_length(result))
        out["metrics"]["queues"] = {q: _plain_metrics(m.as_dict()) for q, m in per_queue.items()}
    if rounds:
        out["rounds"] = [_round_json(r, queues=bool(result.queues)) for r in result.rounds]
    return out


def _job_json(j: JobRecord) -> dict[str, Any]:
    return {
        "name": j.name,
        "application": j.application,
        "category": j.category,
        "submit_time": _num(j.submit_time),
        "start_time": _num(j.start_time),
        "finish_time": _num(j.finish_time),
        "jct": _num(j.jct),
        "gpu_seconds": _num(j.gpu_seconds),
        "restarts": int(j.restarts),
        "isolated_jct": _num(j.isolated_jct),
        "contention": _num(j.contention),
        "rho": _num(_rho(j)),
        "queue": j.queue,
        "priority": j.priority,
    }


def _queues_json(result: SimResult) -> dict[str, Any]:
    """The queue configuration of a run with queues."""
    return {
        "queues": {q: {"guarantee": {str(t): int(n) for t, n in spec.guarantee.items()},
                       "guarantee_units": _num(spec.guarantee_units)}
                   for q, spec in result.queues.items()},
        "unit_weights": {str(t): _num(w) for t, w in result.unit_weights.items()},
        "min_runtime_s": _num(result.min_runtime_s),
    }


def _round_json(r: RoundRecord, *, queues: bool) -> dict[str, Any]:
    """One round; with `queues`, also what each queue held and was owed."""
    return {
        "time": _num(r.time),
        "policy_seconds": _num(r.policy_seconds),
        "active_jobs": int(r.active_jobs),
        "gpus_in_use": {str(k): int(v) for k, v in r.gpus_in_use.items()},
        "allocations": {str(k): [str(t), int(g)] for k, (t, g) in r.allocations.items()},
        "restarted": list(r.restarted),
        **({} if not queues else {
            "held": {q: dict(h) for q, h in r.held.items()},
            "owed": None if r.owed is None else {
                q: {k: _num(v) for k, v in o.items()} for q, o in r.owed.items()},
            "restore_s": _num(r.restore_s)}),
    }


def from_json(data: Mapping[str, Any]) -> SimResult:
    """The inverse of `to_json` (for re-plotting saved runs). Without rounds in the
    data the result has none."""
    jobs = tuple(
        JobRecord(
            name=j["name"],
            application=j["application"],
            category=j["category"],
            submit_time=float(j["submit_time"]),
            start_time=j.get("start_time"),
            finish_time=j.get("finish_time"),
            gpu_seconds=float(j["gpu_seconds"]),
            restarts=int(j["restarts"]),
            isolated_jct=j.get("isolated_jct"),
            contention=float(1.0 if j.get("contention") is None else j["contention"]),
            queue=j.get("queue", ""),
            priority=j.get("priority", ""),
        )
        for j in data["jobs"]
    )
    rounds = tuple(
        RoundRecord(
            time=float(r["time"]),
            policy_seconds=float(r["policy_seconds"]),
            active_jobs=int(r["active_jobs"]),
            gpus_in_use=dict(r["gpus_in_use"]),
            allocations={k: (str(t), int(g)) for k, (t, g) in r.get("allocations", {}).items()},
            restarted=tuple(r.get("restarted", ())),
            held={q: dict(h) for q, h in (r.get("held") or {}).items()},
            owed=r.get("owed"),
            restore_s=float(r.get("restore_s") or 0.0),
        )
        for r in data.get("rounds", ())
    )
    return SimResult(
        workload=data["workload"],
        policy=data["policy"],
        cluster=data["cluster"],
        capacity=dict(data["capacity"]),
        jobs=jobs,
        rounds=rounds,
        wall_seconds=float(data.get("wall_seconds") or 0.0),
        cpu_seconds=float(data.get("cpu_seconds") or 0.0),
        params=dict(data.get("params") or {}),
        settings=dict(data.get("settings") or {}),
        round_seconds=data.get("round_seconds"),
        queues={q: QueueSpec(guarantee=dict(spec["guarantee"]),
                             guarantee_units=float(spec.get("guarantee_units") or 0.0))
                for q, spec in (data.get("queues") or {}).items()},
        unit_weights=dict(data.get("unit_weights") or {}),
        min_runtime_s=float(data.get("min_runtime_s") or 0.0),
    )
