"""The trace-driven, discrete-time simulator.

Jobs arrive at their trace times; every round the policy under test (the very
`Policy.optimize` the controller calls) allocates, the placer places, and each
running job then advances by what it would really achieve over the round
(`sia_grpc.emulation`: measured step times, statistical efficiency by epoch, calibrated
slowdowns), losing its checkpoint-restore delay whenever its GPUs change.

With queues (`policy.queues`), every job carries its queue and priority class and the
time it has run on its current allocation, the policy gets the queues, and each
round records what every queue held per GPU type (measured from the allocations
the simulator applies) and what the policy's guarantee rows say it was owed.

The policy sees only what a real scheduler would: each job's goodput model is
Sia's bootstrapped estimator, fed with 1-GPU profiles of every type at
submission and then with the step times the job reports from its own runs —
never the simulator's ground truth.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sia_grpc.emulation import AppTruth, load_app
from sia_grpc.models.bootstrap import JobGoodputModel, ThroughputEstimator
from sia_grpc.models.efficiency import gain
from sia_grpc.models.goodput import NUM_BATCH_SAMPLES
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.queues import DEFAULT_QUEUE, QueueSet
from sia_grpc.policy.types import (
    Adaptivity,
    JobAllocation,
    Policy,
    PolicyJob,
    RoundResult,
    warm_arg,
)
from sia_grpc.sim.records import JobRecord, QueueSpec, RoundRecord, SimResult
from sia_grpc.sim.workload import Category, TraceJob

_ADAPTIVITY = {Category.ADAPTIVE: Adaptivity.ADAPTIVE, Category.RIGID: Adaptivity.RIGID,
               Category.STRONG_SCALING: Adaptivity.STRONG_SCALING}


_EPS_S = 1e-6  # arrival-time slack: round starts are multiples of a float round length


@dataclass(frozen=True)
class SimConfig:
    # The round length is the policy's own `round_duration` (60 s Sia, 360 s Gavel
    # by default; `make_policy(..., round_duration=)` sets it): one setting, which
    # the policy's round-based terms and the simulated rounds share.
    max_hours: float = 24 * 14.0  # stop even if jobs remain (reported as unfinished)
    # Seconds each start and move costs beyond the application's own restore, paid by
    # the job and priced to the policy alike: what a scheduler in front adds (the Slurm
    # bridge's measured share, `sia bench slurm`); 0: the cluster's own agents.
    move_cost_s: float = 0.0


@dataclass
class _Job:
    """A job's state inside the simulator (mutable; never seen by the policy)."""

    trace: TraceJob
    app: AppTruth
    model: JobGoodputModel  # the scheduler's estimate, fed by profiles and observations
    progress: float = 0.0
    restarts: int = 0
    gpu_seconds: float = 0.0
    start_time: float | None = None
    finish_time: float | None = None
    delay: float = 0.0  # restore time still to pay before training resumes
    alloc: JobAllocation | None = None
    since: float = 0.0  # when its current allocation began (for its stint)
    observed: set = field(default_factory=set)
    active_rounds: int = 0
    active_sum: int = 0  # Σ active jobs over the rounds this job was active
    attained: dict[str, float] = field(default_factory=dict)  # seconds held, per GPU type
    batch: int | None = None  # global batch of its last run; None before it first runs
    move_cost_s: float = 0.0  # SimConfig.move_cost_s

    @property
    def restart_delay(self) -> float:
        """What each (re)start costs it: its application's restore, and what the
        scheduler in front adds."""
        return self.app.restart_delay + self.move_cost_s

    @classmethod
    def arrive(cls, trace: TraceJob, move_cost_s: float = 0.0) -> _Job:
        app = load_app(trace.application)
        model = JobGoodputModel(
            estimator=_bootstrap(app), grad=app.grad_params(0.0),
            init_batch_size=app.init_batch_size,
            max_batch_size=max(app.max_batch_size, trace.batch_size),
            local_bsz_limits={g: app.local_bsz_limits(g) for g in app.gpu_types})
        return cls(trace, app, model, move_cost_s=move_cost_s)

    def policy_job(self, now: float) -> PolicyJob:
        t, app = self.trace, self.app
        # The job reports its gradient statistics, as measured at the batch size
        # it last ran with; the model's batch grids are shared across
        # `with_grad` copies, so they survive from round to round.
        # The trace's hand-tuned count and batch: what rigid and strong-scaling jobs
        # run with, and what rigid schedulers (Gavel, FIFO) give every job.
        return PolicyJob(
            job_id=t.name,
            model=self.model.with_grad(app.grad_params(self.progress, self.batch)),
            adaptivity=_ADAPTIVITY[t.category], num_gpus=t.num_replicas,
            batch_size=t.batch_size, age=max(now - t.time, 0.0), num_restarts=self.restarts,
            restart_cost=self.restart_delay, submit_time=t.time, attained=dict(self.attained),
            progress=self.progress / app.max_progress,
            restoring=self.alloc is not None and self.delay > 0,
            queue=t.queue or DEFAULT_QUEUE, priority=t.priority,
            stint=now - self.since if self.alloc is not None else 0.0)


def _bootstrap(app: AppTruth) -> ThroughputEstimator:
    """Sia's profiling pass: one GPU of each type over the seed batch sizes."""
    est = ThroughputEstimator()
    for gpu_type in app.gpu_types:
        seed = app.seed_profile(gpu_type)
        lo, hi = app.local_bsz_limits(gpu_type)
        sizes = (np.unique(seed.local_bsz) if seed is not None
                 else np.unique(np.geomspace(lo, hi, 10).round()))
        sizes = sizes[(sizes >= lo) & (sizes <= hi)]
        for bsz in sizes:
            step, sync = app.step_time(gpu_type, 1, 1, int(bsz))
            est.add_profile(gpu_type, int(bsz), step, sync)
    return est


def simulate(workload: Sequence[TraceJob], cluster: Cluster, policy: Policy, *,
             workload_name: str = "", cluster_name: str = "",
             config: SimConfig = SimConfig(), queues: QueueSet | None = None,
             on_progress: Callable[[int, int, float], None] | None = None) -> SimResult:
    """Replay `workload` on `cluster` under `policy`; deterministic for equal inputs.
    With `queues`, the policy is given them and the rounds record each queue's
    GPUs (the jobs' queues are their traces', `default` where none is named).
    `on_progress(jobs finished, jobs total, simulated seconds)`: called after each
    simulated round (not for idle gaps); it sees the results, never changes them."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    round_s = policy.round_duration
    if queues is not None:  # every job in a queue and class they define (else FieldError)
        workload = [dataclasses.replace(j, queue=queues.queue(j.queue).name,
                                        priority=queues.priority(j.priority).name)
                    for j in workload]
    pending = sorted(workload, key=lambda j: (j.time, j.name))
    jobs: dict[str, _Job] = {}
    previous: dict[str, JobAllocation] = {}
    warm = None  # what the last round leaves the next to start from (speed only)
    rounds: list[RoundRecord] = []
    now, k = 0.0, 0
    finished = 0  # counted only for on_progress
    horizon = config.max_hours * 3600.0
    while (k < len(pending) or any(j.finish_time is None for j in jobs.values())) \
            and now < horizon:
        while k < len(pending) and pending[k].time <= now + _EPS_S:
            jobs[pending[k].name] = _Job.arrive(pending[k], config.move_cost_s)
            k += 1
        active = [j for j in jobs.values() if j.finish_time is None]
        if not active:
            now = _next_round_at(pending[k].time, now, round_s)
            continue
        t0 = time.perf_counter()
        kw: dict[str, Any] = {**({} if queues is None else {"queues": queues}),
                              **warm_arg(policy, warm)}
        result = policy.optimize(cluster, [j.policy_job(now) for j in active], previous, **kw)
        warm = result.warm
        spent = time.perf_counter() - t0
        rounds.append(_play_round(active, result, now, round_s, cluster, queues, spent))
        previous = {n: a for n, a in result.allocations.items()
                    if jobs[n].finish_time is None}
        now += round_s
        if on_progress is not None:
            finished += sum(j.finish_time is not None for j in active)
            on_progress(finished, len(pending), now)
    return SimResult(
        workload=workload_name, policy=policy.name, cluster=cluster_name,
        capacity=dict(cluster.capacity),
        jobs=tuple(_record(j, cluster) for j in sorted(jobs.values(), key=lambda j: j.trace.name)),
        rounds=tuple(rounds), wall_seconds=time.perf_counter() - wall0,
        cpu_seconds=time.process_time() - cpu0, round_seconds=round_s,
        **({} if queues is None else _queue_specs(queues)))


def _next_round_at(arrival: float, now: float, round_s: float) -> float:
    """While nothing is active: the first round at or after the next arrival."""
    n = np.ceil(arrival / round_s)
    n += n * round_s < arrival  # float rounding can land just before it
    return max(now + round_s, n * round_s)


def _play_round(active: Sequence[_Job], result: RoundResult, now: float, round_s: float,
                cluster: Cluster, queues: QueueSet | None, spent: float) -> RoundRecord:
    """Give every active job its allocation of `result` and advance it over the round;
    the round's record (`spent`: the policy's wall time)."""
    in_use = dict.fromkeys(cluster.gpu_types, 0)
    restarted = []
    for j in active:
        alloc = result.allocations.get(j.trace.name)
        if _apply(j, alloc, now):
            restarted.append(j.trace.name)
        j.active_rounds += 1
        j.active_sum += len(active)
        if alloc is not None:
            in_use[alloc.config.gpu_type] += alloc.config.num_gpus
            _advance(j, alloc, now, round_s)
    return RoundRecord(
        time=now, policy_seconds=spent, active_jobs=len(active), gpus_in_use=in_use,
        allocations={n: (a.config.gpu_type, a.config.num_gpus)
                     for n, a in result.allocations.items()},
        restarted=tuple(restarted),
        **({} if queues is None else _queue_round(active, result, queues, cluster)))


def _queue_round(active: Sequence[_Job], result: RoundResult, queues: QueueSet,
                 cluster: Cluster) -> dict:
    """A round's queue fields of its RoundRecord. Held: the GPUs of the allocations the
    jobs were given (what `_apply` switched them to), never the policy's own count."""
    held = {q.name: dict.fromkeys(cluster.gpu_types, 0) for q in queues.queues}
    for j in active:
        if j.alloc is not None:
            held[j.trace.queue][j.alloc.config.gpu_type] += j.alloc.config.num_gpus
    return dict(held=held, owed=owed_by_rows(result, queues),
                restore_s=max(j.restart_delay for j in active))


def owed_by_rows(result: RoundResult, queues: QueueSet) -> dict[str, dict[str, float]] | None:
    """What each queue is owed per GPU type (and "units"), from the policy's
    guarantee rows `guarantee <queue>/<type or units>` (Σ −GPUs ≤ −owed); None when
    the policy reports no queue usage at all (it does not honour queues)."""
    if not result.queues:
        return None
    owed: dict[str, dict[str, float]] = {q.name: {} for q in queues.queues}
    for name, (_, bound) in result.rows.items():
        kind, _, where = name.partition(" ")
        queue, _, key = where.partition("/")
        if kind == "guarantee" and queue in owed and key:
            owed[queue][key] = -float(bound)
    return owed


def _queue_specs(queues: QueueSet) -> dict:
    """The SimResult fields of a run with queues."""
    return dict(
        queues={q.name: QueueSpec(guarantee=dict(q.guarantee),
                                  guarantee_units=float(q.guarantee_units))
                for q in queues.queues},
        unit_weights=dict(queues.unit_weights),
        min_runtime_s=max(queues.min_runtime(q.name) for q in queues.queues))


def _apply(job: _Job, alloc: JobAllocation | None, now: float) -> bool:
    """Switch the job to its new allocation; a change of GPUs costs a restore.
    Whether this began a checkpoint-restart cycle of the job."""
    old = job.alloc
    changed = (old is None) != (alloc is None) or (
        old is not None and alloc is not None and old.gpus != alloc.gpus)
    # One checkpoint-restart cycle is one restart: a resize or move of a running
    # job, or a preemption (whose later resume completes the same cycle). Every
    # (re)start pays the restore delay, the first start included.
    if changed:
        job.since = now
    if changed and alloc is not None:
        job.delay = job.restart_delay
        if job.start_time is None:
            job.start_time = now
    restart = changed and old is not None
    job.restarts += restart
    job.alloc = alloc
    return restart


def _advance(job: _Job, alloc: JobAllocation, now: float, round_s: float) -> None:
    """Progress over one round on `alloc`, from the ground truth."""
    app, conf = job.app, alloc.config
    job.gpu_seconds += conf.num_gpus * round_s
    job.attained[conf.gpu_type] = job.attained.get(conf.gpu_type, 0.0) + round_s
    usable = max(round_s - job.delay, 0.0)
    job.delay = max(job.delay - round_s, 0.0)
    if usable <= 0:
        return
    reps, atomic, accum = alloc.num_replicas, alloc.atomic_bsz, alloc.accum_steps
    job.batch = reps * atomic * (accum + 1)
    rate, step, sync = app.progress_rate(conf.gpu_type, conf.num_nodes, reps, atomic, accum,
                                         job.progress)
    key = (conf.gpu_type, conf.num_nodes, reps, atomic)
    if key not in job.observed:  # the job reports its measured step time once per shape
        job.observed.add(key)
        job.model.estimator.add_observation(conf.gpu_type, conf.num_nodes, reps, atomic, accum,
                                      step, sync)
    # The rate holds within an epoch; a round can span several (a small model on
    # many fast GPUs), each at its own statistical efficiency.
    bounds = app.epoch_bounds()
    while True:
        end = bounds[app.epoch(job.progress)][1]
        if end >= app.max_progress:  # the last epoch: finish in this round, or not
            left = app.max_progress - job.progress
            if rate * usable >= left:
                job.finish_time = now + round_s - usable + left / rate
                job.progress = app.max_progress
                # GPUs are held until the round ends; charge only the time used.
                job.gpu_seconds -= conf.num_gpus * (now + round_s - job.finish_time)
            else:
                job.progress += rate * usable
            return
        if rate * usable < end - job.progress:
            job.progress += rate * usable
            return
        usable -= (end - job.progress) / rate
        job.progress = end
        rate = app.progress_rate(conf.gpu_type, conf.num_nodes, reps, atomic, accum,
                                 job.progress)[0]


def _record(job: _Job, cluster: Cluster) -> JobRecord:
    contention = job.active_sum / job.active_rounds if job.active_rounds else 1.0
    return JobRecord(
        name=job.trace.name, application=job.trace.application,
        category=job.trace.category.value, submit_time=job.trace.time,
        start_time=job.start_time, finish_time=job.finish_time,
        gpu_seconds=job.gpu_seconds, restarts=job.restarts,
        isolated_jct=isolated_jct(job.app, job.trace, cluster, contention),
        contention=contention, queue=job.trace.queue, priority=job.trace.priority)


def isolated_jct(app: AppTruth, trace: TraceJob, cluster: Cluster,
                 contention: float) -> float | None:
    """The job's completion time alone on a fair share of the cluster (paper
    eq. 3, extended to heterogeneous clusters): 1/contention of every GPU type.

    Computed from the ground truth: in each epoch the best configuration that fits
    the share (a rigid or strong-scaling job: its tuned count and batch), no
    waiting, one start-up restore. An oracle estimate of what a fair share gives.
    """
    share = {t: max(1, int(cluster.capacity[t] / max(contention, 1.0)))
             for t in cluster.gpu_types}
    fixed = trace.category is not Category.ADAPTIVE
    times: list[float] = []
    batches: list[int] = []
    totals: Sequence[float] | np.ndarray
    for conf in cluster.configs:
        if conf.gpu_type not in app.gpu_types:
            continue
        if fixed:
            if conf.num_gpus != cluster.first_count(trace.num_replicas, gpu_type=conf.gpu_type):
                continue
            reps, totals = trace.num_replicas, [trace.batch_size]
        else:
            if conf.num_gpus > share[conf.gpu_type]:
                continue
            lo = app.local_bsz_limits(conf.gpu_type)[0]
            reps = conf.num_gpus
            # As fine a batch grid as the policy's own (50 geometric steps).
            totals = np.geomspace(max(app.init_batch_size, lo * reps),
                                  max(app.max_batch_size, lo * reps), NUM_BATCH_SAMPLES)
        for total in totals:
            it, b = _iteration(app, conf.gpu_type, conf.num_nodes, reps, float(total))
            if it is not None:
                times.append(it)
                batches.append(b)
    if not times:
        return None
    it_arr, b_arr = np.array(times), np.array(batches)
    total_time = 0.0
    for start, end in app.epoch_bounds():
        rate = np.max(gain(app.grad_params(start, b_arr), b_arr, app.init_batch_size) / it_arr)
        total_time += (end - start) / rate
    return total_time + app.restart_delay


def _iteration(app: AppTruth, gpu_type: str, nodes: int, reps: int,
               total: float) -> tuple[float | None, int]:
    """(iteration time, global batch) of `total` samples split over `reps`
    replicas, with accumulation beyond the type's largest micro-batch."""
    lo, hi = app.local_bsz_limits(gpu_type)
    local = total / reps
    accum = max(int(np.ceil(local / hi - 1e-8)) - 1, 0)
    atomic = int(np.ceil(local / (accum + 1) - 1e-8))
    if not lo <= atomic <= hi:
        return None, 0
    step, sync = app.step_time(gpu_type, nodes, reps, atomic)
    return step + (step - sync) * accum, reps * atomic * (accum + 1)
