"""Scheduling rounds: a tick becomes a solve of the policy over the ready nodes and
the schedulable jobs (early rounds only fill idle GPUs), a solve's result becomes
moves, and a round that cannot run says why.

Changes: round_book, directive_book.
A round's number, its solve in flight and what it was given; a solved round opens
its entry of `DirectiveBook.round_acks` (acknowledged once its directives are). Its
moves go through `moves` and `ledger`."""

from __future__ import annotations

import collections

from sia_grpc.api import node_state_name, pb, seconds, state_name
from sia_grpc.api.convert import allocation_to_pb
from sia_grpc.controller.machine.books import SolveInputs, StateBase
from sia_grpc.controller.machine.events import (
    Action,
    Happened,
    Persist,
    RoundDone,
    RoundSkipped,
    Solve,
    SolveFinished,
    Tick,
    WantRound,
)
from sia_grpc.controller.machine.records import (
    JobRec,
    NodeRec,
    batch_key,
    same_gpus,
    timestamp,
)
from sia_grpc.controller.machine.transitions import TERMINAL, set_reason, set_state
from sia_grpc.models.bootstrap import JobGoodputModel
from sia_grpc.models.efficiency import NEUTRAL_GRAD
from sia_grpc.policy.cluster import Cluster, Node
from sia_grpc.policy.queues import QueueSet, scheduled_in
from sia_grpc.policy.queues import outcome as queueing
from sia_grpc.policy.types import JobAllocation, PolicyJob, RoundResult

# The moved jobs a round records (Round.moves; jobs_moved counts them all): enough to
# read, and a bound on each round kept (1,000 of them, in memory, the store and a
# ListRounds answer), whatever the number of jobs one round moves.
ROUND_MOVES_KEPT = 20

class Rounds(StateBase):
    """A part of `ControllerState`: scheduling rounds (the module docstring)."""

    def _tick(self, ev: Tick, out: list[Action]) -> None:
        self._check_liveness(ev.at, out)
        if self.round_book.solving is not None:
            if ev.early:  # run it once the solve in flight is done, not a round later
                self.round_book.early_after_solve = ev.trigger
            else:  # a solve longer than a round: worth saying
                self._skip(ev, f"round {self.round_book.solving} is still being solved", out)
            return
        # (a node restored from the store without its type waits for its agent)
        ready = [n for n in self.node_book.nodes.values()
                 if n.state == pb.NODE_STATE_READY and n.gpu_type]
        jobs = [r for r in self.job_book.jobs.values() if self._schedulable(r)]
        cluster = Cluster.of(Node(n.name, n.gpu_type, n.num_gpus) for n in ready) \
            if ready else None
        names = {n.name for n in ready}
        policy_jobs, previous, unplaceable = [], {}, []
        # An early round only fills idle GPUs: every job that has GPUs keeps them
        # (reshuffling is the timer round's job, at most once per round length).
        for rec in jobs:
            pj = None if cluster is None else self._policy_job(rec, cluster, ev.at,
                                                                pinned=ev.early)
            if pj is None:
                unplaceable.append(rec)
                continue
            policy_jobs.append(pj)
            cur = rec.target if rec.moving else rec.alloc
            if cur is not None and all(g.node in names for g in cur.gpus):
                previous[rec.job_id] = cur
        for rec in unplaceable:
            self._unplaceable(rec, names, ev.at, out)
        if not policy_jobs:
            self._skip(ev, self._why_no_round(ready, jobs), out)
            return
        assert cluster is not None  # a job was placed: some node is ready
        policy_jobs.extend(self._profile_slots(cluster, ev.at, early=ev.early))
        self.round_book.last_skip = ""
        self.round_book.round_no += 1
        self.round_book.solving = self.round_book.round_no
        self.round_book.started, self.round_book.trigger = ev.at, ev.trigger
        # Without a queue configuration the policy sees no queues: one flat pool.
        queues = None if self.queues == QueueSet() else self.queues
        self.round_book.solve_inputs = SolveInputs(self.round_book.round_no, queues,
                                                   tuple(policy_jobs), previous,
                                                   dict(cluster.capacity))
        out.append(Solve(self.round_book.round_no, ev.trigger, cluster, tuple(policy_jobs),
                         previous, queues))

    def _skip(self, ev: Tick, why: str, out: list[Action]) -> None:
        """A round that did not run says why, once per reason (an idle cluster with
        nothing to schedule says nothing)."""
        if not why or why == self.round_book.last_skip:
            return
        self.round_book.last_skip = why
        rnd = pb.Round(trigger=ev.trigger, note=f"skipped: {why}")
        rnd.start_time.CopyFrom(timestamp(ev.at))
        out.append(RoundSkipped(rnd))

    def _why_no_round(self, ready: list[NodeRec], jobs: list[JobRec]) -> str:
        waiting = collections.Counter(state_name(r.state) for r in self.job_book.jobs.values()
                                      if r.state not in TERMINAL)
        if not waiting:
            return ""
        if not ready:
            states = collections.Counter(node_state_name(n.state).lower()
                                         for n in self.node_book.nodes.values())
            return "no ready node" + (f" ({counts_text(states)})" if states else "")
        if not jobs:
            return f"no job has a profile yet ({counts_text(waiting)})"
        return (f"none of the {len(jobs)} schedulable jobs can run on the ready nodes' GPU "
                f"types ({', '.join(sorted({n.gpu_type for n in ready}))})")

    def _type_gap(self, rec: JobRec) -> str:
        """Why no ready node can run the job, in the words of `kubectl describe`'s
        "0/N nodes are available": the types it needs, and what the cluster has."""
        have = sorted(self._present_types())
        allowed = rec.res.allowed_types
        runnable = set(rec.res.local_bsz_limits) & (allowed if allowed is not None else
                                                    set(rec.res.local_bsz_limits))
        want = sorted(rec.usable & runnable) or sorted(runnable) or sorted(allowed or ())
        has = f"the cluster has {', '.join(have)}" if have else "no node is ready"
        if not want:
            return f"no node it can run on ({has})"
        return f"no ready node of type {' or '.join(want)} ({has})"

    def _solved(self, ev: SolveFinished, out: list[Action]) -> None:
        if ev.round_no != self.round_book.solving:
            return
        self.round_book.solving = None
        if self.round_book.early_after_solve:
            out.append(WantRound(self.round_book.early_after_solve))
            self.round_book.early_after_solve = ""
        self.directive_book.round_acks.setdefault(ev.round_no, set())
        rnd = pb.Round(round=ev.round_no, trigger=self.round_book.trigger, note=ev.error)
        rnd.start_time.CopyFrom(timestamp(self.round_book.started))
        if ev.result is None:
            rnd.note = ev.error or "solve failed: previous allocation kept"
            out.append(RoundDone(rnd))
            return
        res = ev.result
        reasons, reclaims = self._queue_outcome(ev.round_no, res, rnd)
        preempted: list[tuple[str, str]] = []
        moved = 0
        for job_id, reason in reasons.items():
            rec = self.job_book.jobs.get(job_id)
            if rec is not None and rec.state not in TERMINAL:
                moved += self._apply(rec, reason, res.allocations.get(job_id), ev.at, rnd,
                                     reclaims.get(job_id, ""), preempted, out)
        _round_stats(rnd, res, moved)
        out.append(RoundDone(rnd, tuple(preempted)))

    def _apply(self, rec: JobRec, reason: str, new: JobAllocation | None, at: float,
               rnd: pb.Round, reclaimer: str, preempted: list[tuple[str, str]],
               out: list[Action]) -> int:
        """The round's decision for one job: its reason where it stays, else its move
        begun (1: a move; `preempted` gets (queue, why) of one sent away;
        `reclaimer`: the queue taking its GPUs back, if that is why)."""
        queue, _, note = scheduled_in(self.queues, rec.job.spec)
        if note:
            reason = f"{reason} ({note})"
        if same_gpus(rec.target if rec.moving else rec.alloc, new):
            if not rec.moving and (new is not None or rec.state == pb.JOB_STATE_QUEUED):
                set_reason(rec, reason, out)
                if batch_key(new) != batch_key(rec.alloc) and rec.held:
                    assert new is not None  # same GPUs as an allocation that differs
                    self._rebatch(rec, new, out)
            return 0
        # Any GPU of the new allocation on a node that is no longer ready: skip.
        if new is not None and any(self.node_book.nodes.get(g.node) is None or
                                   self.node_book.nodes[g.node].state != pb.NODE_STATE_READY
                                   for g in new.gpus):
            return 0
        if len(rnd.moves) < ROUND_MOVES_KEPT:
            rnd.moves.append(round_move(rec, rec.target if rec.moving else rec.alloc, new))
        rec.target = new
        self._set_moving(rec, True)
        rec.next_reason = reason
        if rec.held and rec.state != pb.JOB_STATE_QUEUED:
            # one checkpoint-restart cycle: a move, resize or preemption
            if new is None:
                preempted.append((queue, "reclaim" if reclaimer else "policy"))
            if reclaimer:
                out.append(Happened(at, pb.EVENT_KIND_QUEUE_RECLAIM,
                                    f"queue {reclaimer} reclaims its guarantee: {rec.job_id} "
                                    f"(queue {queue}) gives way ({reason})",
                                    job_id=rec.job_id, queue=reclaimer))
            rec.begin_restart(at)
            self._stop_everywhere(rec, out)
            set_state(rec, pb.JOB_STATE_RESTARTING, at, f"checkpointing: {reason}")
        elif new is not None:
            # Waiting (a requeued job's old workers may still be stopping: that
            # restart is counted already), or a restored PROFILING job with a profile.
            set_state(rec, pb.JOB_STATE_QUEUED, at,
                      f"starting: on {new.config.num_gpus} {new.config.gpu_type} "
                      "once its GPUs are released")
        out.append(Persist((rec.job_id,)))
        return 1

    def _queue_outcome(self, round_no: int, res: RoundResult,
                       rnd: pb.Round) -> tuple[dict[str, str], dict[str, str]]:
        """The round's reasons with the queue rules that held or preempted jobs in place
        of the policy's, and the reclaims (job -> queue taking its GPUs back); the
        binding guarantee rows and the reclaims go on the round record."""
        inputs, self.round_book.solve_inputs = self.round_book.solve_inputs, None
        if inputs is None or inputs.round_no != round_no or inputs.queues is None:
            return dict(res.reasons), {}
        done = queueing.outcome(inputs.queues, res, inputs.jobs, inputs.previous,
                                inputs.capacity)
        rnd.binding_rows.extend(done.binding)
        rnd.reclaims = len(done.reclaims)
        return {**res.reasons, **done.reasons}, dict(done.reclaims)

    def _schedulable(self, rec: JobRec) -> bool:
        return rec.state not in TERMINAL and bool(rec.usable) and rec.state != pb.JOB_STATE_FAILED

    def _policy_job(self, rec: JobRec, cluster: Cluster, at: float, *,
                    pinned: bool = False) -> PolicyJob | None:
        res = rec.res
        types = rec.usable & set(cluster.gpu_types)
        if res.allowed_types is not None:
            types &= res.allowed_types
        if not types:
            return None
        model = JobGoodputModel(
            estimator=rec.estimator, grad=rec.grad or NEUTRAL_GRAD,
            init_batch_size=res.init_batch_size, max_batch_size=res.max_batch_size,
            local_bsz_limits={t: res.local_bsz_limits[t] for t in types
                              if t in res.local_bsz_limits})
        created = seconds(rec.job.status.create_time)
        queue, priority, _ = scheduled_in(self.queues, rec.job.spec)
        runs = rec.alloc is not None and not rec.moving
        return PolicyJob(
            job_id=rec.job_id, model=model, adaptivity=res.adaptivity, min_gpus=res.min_gpus,
            max_gpus=res.max_gpus, allowed_types=frozenset(types),
            pipeline_gpus=res.pipeline_gpus, batch_size=res.batch_size, num_gpus=res.num_gpus,
            age=max(at - created, 0.0), num_restarts=rec.job.status.restarts,
            restart_cost=rec.restart_s(), submit_time=created, attained=self._attained(rec, at),
            progress=rec.job.status.progress,
            # Still paying its restore (as far as the controller knows): Sia keeps it in
            # place rather than make it start the restore over (the artifact's rule).
            restoring=runs and at - rec.started_at < rec.restart_s(), pinned=pinned,
            queue=queue, priority=priority, stint=max(at - rec.started_at, 0.0) if runs else 0.0)


def round_move(rec: JobRec, before: JobAllocation | None,
               after: JobAllocation | None) -> pb.RoundMove:
    """The round's record of one job whose GPUs it changed: what kind of change, from
    what to what."""
    if after is None:
        kind = "preempt"
    elif before is None:
        kind = "start"
    elif (before.config.gpu_type == after.config.gpu_type
          and before.config.num_gpus != after.config.num_gpus):
        kind = "resize"
    else:  # other GPUs of its type, or another type (Sia's move)
        kind = "move"
    move = pb.RoundMove(job_id=rec.job_id, name=rec.job.spec.name, tenant=rec.job.spec.tenant,
                        kind=kind)
    if before is not None:
        move.before.CopyFrom(allocation_to_pb(before))
    if after is not None:
        move.after.CopyFrom(allocation_to_pb(after))
    return move


def counts_text(c: collections.Counter[str]) -> str:
    """"2 draining, 1 lost"."""
    return ", ".join(f"{n} {k}" for k, n in sorted(c.items()))


def _round_stats(rnd: pb.Round, res: RoundResult, moved: int) -> None:
    """What the round record says of a solve: its jobs, GPUs, moves and timings."""
    t = res.timings
    rnd.jobs = len(res.reasons)
    rnd.gpus_allocated = sum(a.config.num_gpus for a in res.allocations.values())
    rnd.jobs_moved = moved
    rnd.objective = float(res.objective)
    rnd.estimate_ms = 1e3 * t.get("estimate", 0.0)
    rnd.solve_ms = 1e3 * (t.get("build", 0.0) + t.get("solve", 0.0))
    rnd.place_ms = 1e3 * t.get("place", 0.0)
