"""`sia bench slurm`: a trace replayed on a throwaway Slurm cluster two ways, Sia
through the `sia-slurm` bridge beside Slurm alone (results in docs/results.md).

Both arms run the same first N jobs of a trace on a fresh `SlurmCluster` (real
slurmctld and slurmd; rtx-0, rtx-1 with 4 rtx GPUs each, a100-0 with 4 a100),
one after the other, `time_scale` times faster than the trace: arrivals are
divided by it, and each job's work is a modeled worker
(`sia_grpc.bench.slurm_worker`) that trains at the emulation's ground truth with
modeled time running `time_scale` times faster than the clock.

Each worker's modeled work is planned in this process (`slurm_truth`), so the
workers import only the standard library and a copy starts and ends in a fraction
of a second, as a real job's would.

- **Sia**: each job is submitted with `sia slurm submit` at its arrival (its spec
  as `sia replay` submits it to a controller); a bridge (`Bridge.run`, what
  `sia-slurm run --interval` runs, with its WorkerService for the workers'
  reports) places it, and moves it (a copy resumes from the worker's checkpoint).
- **Slurm alone**: each job is `sbatch`ed at its arrival with the trace's own
  request, its hand-tuned GPU count (`num_replicas`, capped at the 4 GPUs of a
  node: the trace was made for 64 GPUs) of any type on one node, and its
  hand-tuned batch size; Slurm's default FIFO with backfill.

JCTs are from Slurm's own records (`squeue --json`: submit and end times, whole
seconds), times `time_scale`: modeled seconds. A Sia job's JCT runs from its first
Slurm job's submission to the end of its last copy.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sia_grpc.api import pb
from sia_grpc.bench.slurm_sim import move_cost_s, simulated
from sia_grpc.bench.slurm_stages import SlurmLogMoments, breakdown, summary
from sia_grpc.bench.slurm_truth import TruthServer
from sia_grpc.client.spec import SpecError, load_spec, spec_to_mapping
from sia_grpc.sim.progress import Display, Reporter, make_display
from sia_grpc.sim.workload import TraceJob, load_workload
from sia_grpc.slurm.bridge import Bridge, RoundReport, in_process_optimizer
from sia_grpc.slurm.commands import Slurm, SlurmError
from sia_grpc.slurm.reports import ReportServer
from sia_grpc.slurm.submit import submit_job
from sia_grpc.slurm.translate import Ticket

__all__ = ["ArmResult", "replay_sia", "replay_slurm", "run"]

_POLL_S = 0.5
# Modeled seconds between a worker's reports to the bridge: a real one reports every
# 5 s (`SIA_REPORT_INTERVAL_S`) against rounds of 60; the bench's rounds are 360
# modeled s, so about as many reports a round. (A report a wall second, as before, was
# one a round: the batch and the gradient statistics Sia saw were a round old, and a
# batch change reached the workers a round late.)
_REPORT_S = 30.0
Progress = Callable[[int, int, float], None]  # (jobs ended, jobs, seconds so far)
_NODE_GPUS = 4  # the test cluster's GPUs per node: Slurm alone's largest request
_DONE = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE"})


@dataclass
class ArmResult:
    """One arm's jobs: name -> JCT and wait to first start (modeled s), how it ended."""

    jct: dict[str, float] = field(default_factory=dict)
    wait: dict[str, float] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    moves: dict[str, int] = field(default_factory=dict)  # copies before the one that finished
    late_copies: dict[str, int] = field(default_factory=dict)  # copies after it (see _result)
    # modeled s from a moved copy's end to the start of the next: Slurm's latency, or
    # waiting for GPUs where Sia took the job's (moved it to held, waiting)
    move_gaps: list[float] = field(default_factory=list)
    makespan: float = 0.0  # modeled s from the first submission to the last end
    wall_s: float = 0.0
    round_s: list[float] = field(default_factory=list)  # the bridge's rounds (wall s)
    actions: int = 0  # the bridge's actions in Slurm (starts, moves, ...)
    failed: list[str] = field(default_factory=list)  # actions Slurm refused, and why
    # Where each move's (and first start's) seconds went (`slurm_stages.breakdown`)
    stages: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    # What the bridge did, each action's modeled hour, kind, job and the policy's reason
    # (why moves happen: the bench's lead on moves the simulator's Sia does not make)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    gpu_h: float = 0.0  # modeled GPU-hours its copies held while their workers ran
    idle_gpu_h: float = 0.0  # of which in copies that made no progress at all

    def summary(self) -> dict[str, float]:
        jct = np.array(list(self.jct.values())) / 3600
        return {"avg_jct_h": float(jct.mean()) if jct.size else float("nan"),
                "p99_jct_h": float(np.percentile(jct, 99)) if jct.size else float("nan"),
                "makespan_h": self.makespan / 3600,
                "avg_wait_h": float(np.mean(list(self.wait.values()))) / 3600
                if self.wait else float("nan"),
                "moves_per_job": float(np.mean(list(self.moves.values())))
                if self.moves else 0.0,
                "late_copies": sum(self.late_copies.values()),
                "move_gap_h_p50": float(np.median(self.move_gaps)) / 3600
                if self.move_gaps else 0.0,
                "finished": sum(s == "COMPLETED" for s in self.states.values()),
                "jobs": len(self.states), "wall_s": self.wall_s,
                "rounds": len(self.round_s), "bridge_actions": self.actions,
                "failed_actions": len(self.failed),
                "round_s_p50": float(np.median(self.round_s)) if self.round_s else 0.0,
                "round_s_p95": float(np.percentile(self.round_s, 95))
                if self.round_s else 0.0,
                "gpu_h": self.gpu_h, "no_progress_gpu_h": self.idle_gpu_h}


class _Records:
    """Slurm's record of every job seen (`squeue --json`; kept past MinJobAge)."""

    def __init__(self, squeue: Callable[[], Mapping]) -> None:
        self._squeue = squeue
        self.jobs: dict[int, Mapping] = {}

    def poll(self) -> dict[int, Mapping]:
        for j in self._squeue().get("jobs", []):
            self.jobs[int(j["job_id"])] = j
        return self.jobs


def _worker(job: TraceJob, scale: float, truth: str) -> list[str]:
    return [sys.executable, "-m", "sia_grpc.bench.slurm_worker", job.application,
            "--time-scale", f"{scale:g}", "--truth", truth,
            "--report-every", f"{_REPORT_S / scale:g}"]


def _submit_at(jobs: Sequence[TraceJob], scale: float, t0: float,
               submit: Callable[[TraceJob], int], wait: Callable[[float], None]) -> dict:
    """Submit each job at its scaled arrival: name -> Slurm job id."""
    ids = {}
    first = jobs[0].time
    for job in jobs:
        wait(t0 + (job.time - first) / scale - time.time())
        ids[job.name] = submit(job)
    return ids


def _wait_done(records: _Records, ended: Callable[[dict[int, Mapping]], int], total: int,
               deadline: float, progress: Progress | None = None) -> dict[int, Mapping]:
    """Poll Slurm until `ended` (of the jobs seen) counts all `total` jobs; each poll
    tells `progress` (jobs ended, total, seconds since the first poll)."""
    t0 = time.time()
    while True:
        jobs = records.poll()
        n = ended(jobs)
        if progress is not None:
            progress(n, total, time.time() - t0)
        if n >= total:
            return jobs
        if time.time() > deadline:
            raise TimeoutError("the jobs did not all end in time: " + ", ".join(
                f"{i} {j.get('name')} {j.get('job_state')}" for i, j in sorted(jobs.items())
                if j.get("job_state") not in _DONE))
        time.sleep(_POLL_S)


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


def _result(groups: Mapping[str, Sequence[Mapping]], scale: float, wall0: float) -> ArmResult:
    """From each job's Slurm records (its copies, in submission order). A job is done
    when a copy of it completes; a copy the bridge submitted in the same moment (it
    read the job running, then moved it) starts from the final checkpoint and ends
    at once: counted in `late_copies`, not in the JCT."""
    out = ArmResult()
    ends = []
    for name, copies in groups.items():
        completed = [i for i, c in enumerate(copies) if c["job_state"] == "COMPLETED"]
        last = copies[completed[0]] if completed else copies[-1]
        out.states[name] = last["job_state"]
        done = completed[0] if completed else len(copies) - 1
        out.moves[name] = done
        out.late_copies[name] = len(copies) - 1 - done if completed else 0
        out.move_gaps += [(b["start_time"] - a["end_time"]) * scale
                          for a, b in zip(copies[:done], copies[1:done + 1], strict=True)
                          if a.get("end_time") and b.get("start_time")]
        started = [c["start_time"] for c in copies if c.get("start_time")]
        if started:
            out.wait[name] = (min(started) - copies[0]["submit_time"]) * scale
        if completed:
            out.jct[name] = (last["end_time"] - copies[0]["submit_time"]) * scale
        if last.get("end_time"):
            ends.append(last["end_time"])
    first = min(c[0]["submit_time"] for c in groups.values())
    out.makespan = (max(ends) - first) * scale if ends else 0.0
    out.wall_s = time.monotonic() - wall0
    return out


class _LockedBridge(Bridge):
    """A `Bridge` whose rounds hold `lock` (the submissions take it too)."""

    def __init__(self, lock: threading.Lock, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lock = lock
        self.round_s: list[float] = []  # wall seconds of each round
        self.actions = 0
        self.acted: list[RoundReport] = []  # the rounds that did something in Slurm
        # (the bench logs errors only: a refused action is a warning in the bridge's log)
        self.failed: list[str] = []

    def round(self) -> RoundReport:
        with self._lock:
            t = time.monotonic()
            report = super().round()
            self.round_s.append(time.monotonic() - t)
            self.actions += len(report.actions)
            self.failed += [f"{a.kind} {a.job_id}: {why}" for a, why in report.failed]
            if report.actions:
                self.acted.append(report)
            return report


def _model_submission(slurm: Slurm, job_id: int, modeled: Callable[[float], float]) -> None:
    """Rewrite the submission time in job `job_id`'s ticket into modeled time."""
    (raw,) = (j for j in slurm.jobs_json()["jobs"] if int(j["job_id"]) == job_id)
    ticket = Ticket.parse(raw["comment"], job_id)
    assert ticket is not None  # (submitted by `sia slurm submit`: it has one)
    slurm.note(job_id, dataclasses.replace(ticket, submitted=modeled(ticket.submitted)))


def replay_sia(slurm_cluster, jobs: Sequence[TraceJob], scale: float, workdir: Path, *,
               truth: TruthServer, interval_s: float = 1.0, timeout_s: float = 900.0,
               progress: Progress | None = None) -> ArmResult:
    """Sia's arm on `slurm_cluster` (SLURM_CONF already pointing at it); `progress`:
    told (jobs ended, jobs, seconds) as they end (`sim.progress.Reporter`)."""
    from sia_grpc.bench.replay import trace_spec  # (seconds to import: before the clock starts)

    token = workdir / "workers.token"
    token.write_text("replay\n")
    slurm = Slurm()
    t0 = time.time()

    def modeled(t: float) -> float:  # the trace's clock: `scale` x faster from t0
        return t0 + (t - t0) * scale

    reports = ReportServer("127.0.0.1:0", "replay", clock=lambda: modeled(time.time()))

    # The bridge sees modeled time: a round lasts `interval_s * scale` seconds and a
    # job's age (which Sia weighs against its restart cost) grows `scale` x faster.
    lock = threading.Lock()  # (a round never sees a ticket before its time is modeled)
    bridge = _LockedBridge(lock, slurm, in_process_optimizer(),
                           round_duration_s=interval_s * scale, reports=reports,
                           clock=lambda: modeled(time.time()))
    submit = functools.partial(
        _submit_sia, spec_of=trace_spec, slurm=slurm, lock=lock, workdir=workdir, token=token,
        report_to=f"127.0.0.1:{reports.port}", scale=scale, truth=truth.address,
        modeled=modeled)
    stop = threading.Event()
    rounds = threading.Thread(target=bridge.run, args=(interval_s, stop), daemon=True)
    wall0 = time.monotonic()
    rounds.start()
    records = _Records(slurm.jobs_json)
    try:
        ids = _submit_at(jobs, scale, t0, submit, _sleep)
        seen = _wait_done(records, lambda js: _ended(_sia_copies(js, ids)), len(ids),
                          time.time() + timeout_s, progress)
    finally:
        stop.set()
        rounds.join(timeout=60)
        reports.stop()
        slurm_cluster.cancel_all()
    out = _result(_sia_copies(seen, ids), scale, wall0)
    out.round_s, out.actions, out.failed = bridge.round_s, bridge.actions, bridge.failed
    names = {str(i): name for name, i in ids.items()}
    out.decisions = [{"t_h": round((modeled(r.read_at) - t0) / 3600, 3), "kind": a.kind,
                      "job": names.get(a.ticket.id, a.ticket.id) if a.ticket else a.job_id,
                      "reason": a.reason} for r in bridge.acted for a in r.actions]
    out.stages = breakdown(bridge.acted, truth.copies(),
                           SlurmLogMoments(slurm_cluster.root / "log"))
    return out


def _submit_sia(job: TraceJob, *, spec_of: Callable[[TraceJob], pb.JobSpec], slurm: Slurm,
                lock: threading.Lock, workdir: Path, token: Path, report_to: str,
                scale: float, truth: str, modeled: Callable[[float], float]) -> int:
    """What `sia slurm submit` does with `job` (its spec `spec_of(job)`), under `lock`
    so that no bridge round sees its ticket before its time is modeled: its Slurm id."""
    spec = workdir / f"{job.name}.json"
    spec.write_text(json.dumps(spec_to_mapping(spec_of(job))))
    with lock:
        try:
            job_id = submit_job(
                load_spec(spec), _worker(job, scale, truth),
                checkpoint_dir=str(workdir / job.name),
                report_to=report_to, report_token_file=str(token),
                output=str(workdir / f"{job.name}-%j.out"))
        except (SpecError, SlurmError, OSError) as err:
            raise RuntimeError(f"sia slurm submit {job.name} failed: {err}") from err
        _model_submission(slurm, job_id, modeled)
    return job_id


def _sia_copies(jobs_seen: Mapping[int, Mapping], ids: Mapping[str, int],
                ) -> dict[str, list[Mapping]]:
    """Each trace job's Slurm jobs (the copies the bridge made of it, by its ticket's
    id: the first copy's Slurm id, `ids`), in submission order."""
    sia_ids = {str(i): name for name, i in ids.items()}
    groups: dict[str, list[Mapping]] = {name: [] for name in ids}
    for job_id, j in sorted(jobs_seen.items()):
        ticket = Ticket.parse(j.get("comment") or "", job_id)
        if ticket is not None and ticket.id in sia_ids:
            groups[sia_ids[ticket.id]].append(j)
    return groups


def _ended(groups: Mapping[str, Sequence[Mapping]]) -> int:
    """How many jobs have ended: all their copies ended, one of them completed or the
    last not cancelled (a copy the bridge cancelled to move the job is followed by
    another; one it cancelled because the job completed meanwhile is the last)."""
    return sum(bool(c) and all(j["job_state"] in _DONE for j in c)
               and (c[-1]["job_state"] != "CANCELLED"
                    or any(j["job_state"] == "COMPLETED" for j in c))
               for c in groups.values())


def replay_slurm(slurm_cluster, jobs: Sequence[TraceJob], scale: float, workdir: Path, *,
                 truth: TruthServer, timeout_s: float = 900.0,
                 progress: Progress | None = None) -> ArmResult:
    """Slurm alone on `slurm_cluster`: each job's own request, FIFO with backfill
    (`progress` as `replay_sia`'s)."""
    slurm = Slurm()
    node_types = [f"--node-type={n}={t}" for n, (t, _) in slurm_cluster.nodes.items()]

    def submit(job: TraceJob) -> int:
        gpus = min(job.num_replicas, _NODE_GPUS)
        cmd = [*_worker(job, scale, truth.address), "--batch-size", str(job.batch_size),
               "--gpus", str(gpus), "--checkpoint", str(workdir / f"{job.name}.json"), *node_types]
        out = slurm.run("sbatch", "--parsable", f"--job-name={job.name}", f"--gres=gpu:{gpus}",
                        "--nodes=1", "--ntasks=1", f"--output={workdir / job.name}-%j.out",
                        "--wrap", f"exec {shlex.join(cmd)}")
        return int(out.strip().split(";")[0])

    wall0, t0 = time.monotonic(), time.time()
    records = _Records(slurm.jobs_json)
    try:
        ids = _submit_at(jobs, scale, t0, submit, _sleep)
        seen = _wait_done(records, lambda js: sum(js.get(i, {}).get("job_state") in _DONE
                                                  for i in ids.values()), len(ids),
                          time.time() + timeout_s, progress)
    finally:
        slurm_cluster.cancel_all()
    return _result({name: [seen[i]] for name, i in ids.items()}, scale, wall0)


def _arm(name: str, replay: Callable[..., ArmResult], jobs, scale: float,
         **kwargs) -> ArmResult:
    """One arm on a fresh cluster, in a fresh directory, its workers' modeled work
    served from this process (`slurm_truth`)."""
    from sia_grpc.testing.slurm import SlurmCluster

    truth = TruthServer()
    with SlurmCluster() as cluster, tempfile.TemporaryDirectory(prefix=f"sia-{name}-") as d:
        old = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(cluster.conf)  # (the CLI and bridge read it)
        try:
            arm = replay(cluster, jobs, scale, Path(d), truth=truth, **kwargs)
            arm.gpu_h, arm.idle_gpu_h = truth.gpu_hours(scale)
            return arm
        finally:
            truth.stop()
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old


def compare(workload: str, first: int, scale: float, *, interval_s: float = 1.0,
            timeout_s: float = 900.0, quiet: bool = False) -> dict:
    """Both arms, Sia's first: their summaries and per-job results. Their progress
    on stderr (`sim.progress`: bars on a terminal, a line every 30 s elsewhere;
    nothing with `quiet`)."""
    jobs = sorted(load_workload(workload), key=lambda j: (j.time, j.name))[:first]
    report: dict = {"workload": workload, "jobs": len(jobs), "time_scale": scale,
                    "bridge_interval_s": interval_s}
    display = make_display(sys.stderr, 2, quiet=quiet)
    try:
        for key, (name, replay, kwargs) in enumerate((
                ("sia", replay_sia, {"interval_s": interval_s}), ("slurm", replay_slurm, {}))):
            _arm_into(report, display, key, name, replay, jobs, scale, timeout_s, kwargs)
    finally:
        display.close()
    report["simulator"] = simulated(jobs, scale, interval_s,
                                    move_cost_s(report["sia"], scale))
    return report


def _arm_into(report: dict, display: Display, key: int, name: str,
              replay: Callable[..., ArmResult], jobs: Sequence[TraceJob], scale: float,
              timeout_s: float, kwargs: Mapping[str, Any]) -> None:
    """Run one arm, its progress on `display`, its results into `report[name]`."""
    display.start(key, f"{name}: {len(jobs)} jobs at {scale:g}x")
    reporter = Reporter(display.update, key)
    arm = _arm(name, replay, jobs, scale, timeout_s=timeout_s,
               progress=lambda done, total, s: reporter(done, total, s * scale), **kwargs)
    display.finish(key, f"  {name}: {arm.summary()['finished']}/{len(jobs)} jobs ended, "
                        f"{arm.wall_s:.0f} s")
    report[name] = {**arm.summary(), "jct_h": {k: v / 3600 for k, v in arm.jct.items()},
                    "states": arm.states, "moves": arm.moves,
                    "wait_h": {k: v / 3600 for k, v in arm.wait.items()}}
    if arm.decisions:
        report[name]["decisions"] = arm.decisions
    if arm.failed:
        report[name]["failed"] = arm.failed
    if arm.stages:
        report[name]["move_stages_s"] = summary(arm.stages["moves"])
        report[name]["start_stages_s"] = summary(arm.stages["starts"])
        report[name]["stages_s"] = arm.stages


def _print_stages(stages: Mapping[str, Mapping[str, float]], what: str) -> None:
    """Where the seconds of the bridge's `what` went (`slurm_stages`), p50 and p90."""
    if not stages:
        return
    n = max(int(v["n"]) for v in stages.values())
    print(f"{what} ({n}), seconds of the clock, p50 / p90: " + ", ".join(
        f"{k} {v['p50']:.2f}/{v['p90']:.2f}" for k, v in stages.items() if k != "elsewhere"))
    if (e := stages.get("elsewhere")) is not None:
        print(f"  Slurm started {e['mean']:.0%} of the {int(e['n'])} one-node copies on "
              f"another node than Sia planned")


def run(workload: str = "saturn/workload-1", first: int = 30, scale: float = 360.0, *,
        interval_s: float = 1.0, timeout_s: float = 900.0, json_out: str | None = None,
        quiet: bool = False) -> int:
    """`sia bench slurm`: print both arms; 1 if a job did not finish in either."""
    from sia_grpc.observability import configure_logging

    configure_logging(level="error")  # (the bridge's actions: the summary tells the story)
    print(f"replaying the first {first} jobs of {workload} at {scale:g}x on a Slurm test "
          f"cluster (2x4 rtx, 1x4 a100), bridge round every {interval_s:g} s",
          file=sys.stderr)
    report = compare(workload, first, scale, interval_s=interval_s, timeout_s=timeout_s,
                     quiet=quiet)
    print(f"{'':14s} {'avg JCT h':>9s} {'p99 JCT h':>9s} {'makespan h':>10s} "
          f"{'wait h':>7s} {'moves/job':>9s} {'late':>4s} {'finished':>8s} {'GPU-h':>6s} "
          f"{'no-progress GPU-h':>17s} {'wall s':>6s}")
    for name, label in (("sia", "Sia (bridge)"), ("slurm", "Slurm alone")):
        r = report[name]
        print(f"{label:14s} {r['avg_jct_h']:9.2f} {r['p99_jct_h']:9.2f} {r['makespan_h']:10.2f} "
              f"{r['avg_wait_h']:7.2f} {r['moves_per_job']:9.2f} {r['late_copies']:4d} "
              f"{r['finished']:>4d}/{r['jobs']:<3d} {r['gpu_h']:6.1f} "
              f"{r['no_progress_gpu_h']:17.1f} {r['wall_s']:6.0f}")
    r = report["sia"]
    print(f"bridge: {r['rounds']} rounds of {r['round_s_p50']:.2f} s (p50), "
          f"{r['round_s_p95']:.2f} s (p95) wall; {r['bridge_actions']} actions in Slurm "
          f"({r['failed_actions']} refused: --json has why); "
          f"a move's copy started {r['move_gap_h_p50']:.2f} h (p50) after the old one ended")
    _print_stages(r.get("move_stages_s", {}), "moves")
    _print_stages(r.get("start_stages_s", {}), "first starts")
    sim = report["simulator"]
    print(f"the simulator's Sia, same jobs and GPUs, rounds of {interval_s * scale:g} s, "
          f"each start and move {sim['move_cost_s']:.0f} s beyond the restore (the "
          f"bridge's, measured above), mean of {sim['phases']} phases of its rounds: avg "
          f"JCT {sim['avg_jct_h']:.2f} h ({sim['avg_jct_h_range'][0]:.2f}-"
          f"{sim['avg_jct_h_range'][1]:.2f}), p99 {sim['p99_jct_h']:.2f} h, makespan "
          f"{sim['makespan_h']:.2f} h, {sim['moves_per_job']:.2f} moves/job")
    report["avg_jct_ratio"] = report["sia"]["avg_jct_h"] / report["slurm"]["avg_jct_h"]
    report["sim_ratio"] = report["sia"]["avg_jct_h"] / sim["avg_jct_h"]
    print(f"Sia / Slurm alone average JCT: {report['avg_jct_ratio']:.2f}x; "
          f"Sia through the bridge / the simulator's: {report['sim_ratio']:.2f}x")
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2) + "\n")
    ok = all(report[a]["finished"] == report[a]["jobs"] for a in ("sia", "slurm"))
    return 0 if ok else 1
