"""What the dashboard knows of the cluster, built from what the controller's API sends:
the jobs (from WatchJobs), each job's allocation history, goodput estimate and reported
throughput, restarts and reasons as this process saw them change, the cluster
(GetCluster), the last rounds (ListRounds, WatchRounds) and the queues (ListQueues).
Pure: no I/O, times are passed in."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from sia_grpc.api import pb, seconds, state_name
from sia_grpc.api.present import UNITS  # (also a queue's series of its type-flexible guarantee)

MAX_ROUNDS = 50  # rounds kept (and shown)
MAX_STEPS = 500  # allocation changes kept per job (the oldest are dropped)
MAX_NOTES = 200  # reasons kept per job
MAX_RATES = 500  # changes of goodput estimate or reported throughput kept per job
MAX_RESTARTS = 100  # restarts kept per job
MAX_SAMPLES = 2000  # changes kept of each series over time (GPUs allocated per type, ...)
# Changes kept of each queue's series: a queue has one per GPU type, so fewer each,
# to keep the Queues page's charts (redrawn on each change) as light as the cluster's.
MAX_QUEUE_SAMPLES = 500
# A job's history where what it held is not known: from its start to its last change
# before this process first saw it (JobRecord.history; no GPU type has this name).
UNKNOWN = "?"
# The jobs counted over time, by what they are doing.
ACTIVITIES = {"waiting": (pb.JOB_STATE_QUEUED, pb.JOB_STATE_PROFILING),
              "running": (pb.JOB_STATE_RUNNING, pb.JOB_STATE_RESTARTING)}


@dataclass(frozen=True)
class Step:
    """From `at` on, the job held `num_gpus` GPUs of `gpu_type` ("" and 0: none;
    `UNKNOWN` and 0: not known)."""

    at: float
    gpu_type: str
    num_gpus: int


@dataclass(frozen=True)
class Note:
    """What the controller said about the job (its reason, or failure message) at `at`."""

    at: float
    state: str
    text: str


@dataclass(frozen=True)
class Rate:
    """From `at` on, the scheduler's goodput estimate and the throughput the job
    reported (both samples/s; the estimate scaled by statistical efficiency)."""

    at: float
    goodput: float
    throughput: float


@dataclass
class Restart:
    """A restart seen at `at` (the job at `generation` then): from the GPUs it held
    (`src`, a (type, count)) to those it ran on next (`dst`, None until it runs again),
    and its cost as the controller measured it (None until measured)."""

    at: float
    generation: int
    src: tuple[str, int]
    dst: tuple[str, int] | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class Use:
    """From `at` on, a queue held `held` GPUs of a type (or, for its type-flexible
    guarantee, units) against its guarantee of them, `borrowed` of them beyond it (as
    the controller counts borrowing)."""

    at: float
    held: float
    guarantee: float
    borrowed: float = 0.0


@dataclass
class QueueHistory:
    """A queue over time, as this process saw it: per GPU type (and `UNITS`, for a
    type-flexible guarantee) what it held against its guarantee, and its jobs pending."""

    use: dict[str, list[Use]] = field(default_factory=dict)
    pending: list[Step] = field(default_factory=list)


@dataclass
class JobRecord:
    job: pb.Job
    history: list[Step] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    rates: list[Rate] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    # When this process first saw the job: history before it is what the job's
    # create and start times tell, not every change.
    seen_from: float = 0.0
    # When this process last took a version of it: a snapshot after the watch was
    # down cannot say when, since then, the job was moved (`_allocation_change`).
    seen_at: float = 0.0

    def allocation(self) -> tuple[str, int]:
        a = self.job.status.allocation
        return (a.gpu_type, a.num_gpus) if a.num_gpus else ("", 0)


def _when(job: pb.Job, now: float) -> float:
    """When this version of the job was made: its update time, else `now`."""
    return seconds(job.status.update_time) or now


def _note(job: pb.Job, at: float) -> Note | None:
    text = job.status.message or job.status.reason
    return Note(at, state_name(job.status.state), text) if text else None


class Model:
    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}
        self.revision = 0  # the newest job revision seen
        self.cluster: pb.Cluster = pb.Cluster()
        self.rounds: deque[pb.Round] = deque(maxlen=MAX_ROUNDS)
        self.queues: pb.ListQueuesResponse = pb.ListQueuesResponse()
        self.upstream = "connecting"  # "live", or why the controller is not reachable
        # Over time, as this process saw it: GPUs allocated per type, jobs waiting and
        # running (ACTIVITIES).
        self.allocated: dict[str, list[Step]] = {}
        self.jobs_by: dict[str, list[Step]] = {name: [] for name in ACTIVITIES}
        self.queue_use: dict[str, QueueHistory] = {}  # by queue name

    # -- jobs --

    def apply(self, ev: pb.JobEvent, now: float) -> JobRecord | None:
        """Take one WatchJobs event; the job's record, None when it was deleted."""
        job = ev.job
        self.revision = max(self.revision, ev.revision)
        if ev.kind == pb.JobEvent.KIND_DELETED:
            self.jobs.pop(job.job_id, None)
            return None
        rec = self.jobs.get(job.job_id)
        before: pb.JobStatus | None = None  # the version this one follows, if seen
        if rec is None:
            rec = self.jobs[job.job_id] = self._first_sight(
                job, now, ev.kind == pb.JobEvent.KIND_SNAPSHOT)
        elif job.revision and job.revision < rec.job.revision:
            return rec  # an older version (a snapshot after a reconnect raced a change)
        else:
            before = rec.job.status
        rec.job = job
        # A change seen live happened now; a snapshot's, when its update time says.
        at = _when(job, now) if ev.kind == pb.JobEvent.KIND_SNAPSHOT else now
        held = (rec.history[-1].gpu_type, rec.history[-1].num_gpus)
        if before is not None:
            _restarts(rec, before, held, at)
        _rate(rec, at)
        _allocation_change(rec, before, held, at, ev.kind == pb.JobEvent.KIND_SNAPSHOT)
        rec.seen_at = now
        note = _note(job, at)
        if note and (not rec.notes or (rec.notes[-1].state, rec.notes[-1].text)
                     != (note.state, note.text)):
            _append(rec.notes, note, MAX_NOTES)
        return rec

    @staticmethod
    def _first_sight(job: pb.Job, now: float, snapshot: bool) -> JobRecord:
        """A job seen for the first time: its history from its create time, with no
        GPUs until its start; from its start on, what it holds now only where that is
        known to be so (its first allocation, held since), else `UNKNOWN` until the
        version seen was made (a snapshot's update time; a live change's, now), never
        an allocation drawn over a time it may not have held it."""
        created = seconds(job.status.create_time) or now
        rec = JobRecord(job, [Step(created, "", 0)], seen_from=now)
        a = job.status.allocation
        started = seconds(job.status.start_time) or (_when(job, now) if a.num_gpus else 0.0)
        if not started:
            return rec  # never started: no GPUs since its creation
        started = max(started, created)
        known = max(_when(job, now) if snapshot else now, started)
        if known > started and not (a.num_gpus and job.status.generation <= 1):
            rec.history.append(Step(started, UNKNOWN, 0))
        else:
            known = started  # its first allocation, held since it started
        if a.num_gpus or rec.history[-1].gpu_type == UNKNOWN:
            rec.history.append(Step(known, a.gpu_type if a.num_gpus else "", a.num_gpus))
        return rec

    def keep_only(self, job_ids: set[str]) -> list[str]:
        """Forget the jobs not in `job_ids` (deleted while the watch was down); their ids."""
        gone = [j for j in self.jobs if j not in job_ids]
        for j in gone:
            del self.jobs[j]
        return gone

    # -- over time --

    def sample(self, now: float) -> bool:
        """Note what is allocated of each GPU type, and how many jobs wait and run,
        where it changed (after each read of the cluster); whether any did."""
        changed = [_change(self.allocated.setdefault(t.gpu_type, []),
                           Step(now, t.gpu_type, t.allocated)) for t in self.cluster.types]
        for name, states in ACTIVITIES.items():
            count = sum(1 for r in self.jobs.values() if r.job.status.state in states)
            changed.append(_change(self.jobs_by[name], Step(now, name, count)))
        return any(changed)

    def sample_queues(self, now: float) -> bool:
        """Note what each queue holds against its guarantee, per GPU type (and in
        units, for a type-flexible guarantee), and its jobs pending, where it changed
        (after each read of the queues); whether any did. A type it held before and
        holds no more is noted at 0."""
        changed = []
        for q in self.queues.queues:
            hist = self.queue_use.setdefault(q.spec.name, QueueHistory())
            now_use = {t: Use(now, q.held.get(t, 0), q.spec.guarantee.get(t, 0),
                              q.borrowed.get(t, 0))
                       for t in {*q.spec.guarantee, *q.held, *hist.use} - {UNITS}}
            if q.spec.guarantee_units or UNITS in hist.use:
                now_use[UNITS] = Use(now, q.held_units, q.spec.guarantee_units)
            for key, use in now_use.items():
                series = hist.use.setdefault(key, [])
                if not series or replace(series[-1], at=now) != use:
                    _append(series, use, MAX_QUEUE_SAMPLES)
                    changed.append(True)
            changed.append(_change(hist.pending, Step(now, "pending", q.pending_jobs),
                                   MAX_QUEUE_SAMPLES))
        return any(changed)

    # -- rounds --

    def set_rounds(self, rounds: list[pb.Round]) -> None:
        self.rounds.clear()
        self.rounds.extend(rounds)

    def add_round(self, rnd: pb.Round) -> bool:
        """Take one WatchRounds round; False if it is one already known."""
        if rnd.round and any(r.round == rnd.round for r in self.rounds):
            return False
        self.rounds.append(rnd)
        return True


def _allocation_change(rec: JobRecord, before: pb.JobStatus | None, held: tuple[str, int],
                       at: float, snapshot: bool) -> None:
    """Note where the job's allocation changed from `held`, at `at`. A snapshot after
    this process was away that says the job was moved (another allocation, or a later
    generation) cannot say when: from when this process last saw it until the version
    was made, what it held is `UNKNOWN`, not the old allocation drawn on."""
    alloc, last = rec.allocation(), rec.history[-1].at
    moved = held != alloc or (before is not None and rec.job.status.generation
                              != before.generation)
    if snapshot and before is not None and moved and at > max(rec.seen_at, last):
        _append(rec.history, Step(max(rec.seen_at, last), UNKNOWN, 0), MAX_STEPS)
        _append(rec.history, Step(at, *alloc), MAX_STEPS)
    elif held != alloc:
        _append(rec.history, Step(max(at, last), *alloc), MAX_STEPS)


def _rate(rec: JobRecord, at: float) -> None:
    """Note the job's goodput estimate and reported throughput where they changed."""
    st, last = rec.job.status, rec.rates[-1] if rec.rates else Rate(at, 0.0, 0.0)
    if (st.goodput, st.throughput) != (last.goodput, last.throughput):
        _append(rec.rates, Rate(max(at, last.at), st.goodput, st.throughput), MAX_RATES)


def _restarts(rec: JobRecord, before: pb.JobStatus, held: tuple[str, int], at: float) -> None:
    """What this version of the job says of its restarts, after `before`: one more
    began (from `held`, the GPUs it held), the last one runs again, it was measured.
    (One version may say all three: a snapshot after the dashboard was away.)"""
    st = rec.job.status
    if st.restarts > before.restarts:
        _append(rec.restarts, Restart(at, before.generation, held), MAX_RESTARTS)
    last = rec.restarts[-1] if rec.restarts else None
    if last is None:
        return
    if last.dst is None and st.allocation.num_gpus and st.generation > last.generation:
        last.dst = (st.allocation.gpu_type, st.allocation.num_gpus)
    if last.seconds is None and st.restart_seconds and (
            st.restart_seconds != before.restart_seconds):
        last.seconds = st.restart_seconds


def _append(items: list, item: object, limit: int) -> None:
    items.append(item)
    del items[:-limit]


def _change(series: list[Step], step: Step, limit: int = MAX_SAMPLES) -> bool:
    """Append `step` to `series` (of at most `limit`) unless its value is the last
    one's; whether it was."""
    if series and series[-1].num_gpus == step.num_gpus:
        return False
    _append(series, step, limit)
    return True
