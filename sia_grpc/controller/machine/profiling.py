"""Profiling passes (the paper's bootstrap): one idle GPU of each type for a short
pass, results, refusals, passes an agent reports, profiling slots in the ILP, and
the reuse of an identical earlier job's profiles.

Changes: profile_book, change_book.
Passes wanted, shared and cached; the marks of passes changed and of types to look
at again. A pass's GPU is booked in its node's record (`NodeRec.holder`); its
STOPs go through `moves`."""

from __future__ import annotations

from collections.abc import Iterable

from sia_grpc.api import pb, seconds
from sia_grpc.controller.machine.books import CachedProfile, ProfileKey, StateBase
from sia_grpc.controller.machine.events import (
    Action,
    AgentRegistered,
    Persist,
    Send,
    WantRound,
)
from sia_grpc.controller.machine.records import (
    JobRec,
    NodeRec,
    sync_part,
    valid_grad,
    valid_sample,
)
from sia_grpc.controller.machine.transitions import TERMINAL, set_reason, set_state
from sia_grpc.controller.machine.validation import profile_batch_sizes
from sia_grpc.models.bootstrap import JobGoodputModel, ThroughputEstimator
from sia_grpc.models.efficiency import NEUTRAL_GRAD, GradParams
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.queues import scheduled_in
from sia_grpc.policy.queues.outcome import units
from sia_grpc.policy.types import Adaptivity, PolicyJob

PROFILE_SLOT = "~profile:"  # no job id can start with "~"


def profile_key(rec: JobRec, gpu_type: str) -> ProfileKey:
    """What a 1-GPU profile of `gpu_type` depends on: the workload (its application,
    its command, GPUs per replica) and the batch sizes a pass times (the type's
    limits). Tenant, name, queue, target and the batch bounds of the whole job do not
    change a step's time, so they are not in it."""
    spec = rec.job.spec
    return (spec.application, tuple(spec.command), rec.res.pipeline_gpus, gpu_type,
            rec.res.local_bsz_limits.get(gpu_type))


class Profiling(StateBase):
    """A part of `ControllerState`: profiling passes (the module docstring)."""

    def _profiled(self, rec: JobRec, node: NodeRec, t: pb.Telemetry, at: float,
                  out: list[Action]) -> None:
        where = rec.profiling.get(node.gpu_type)
        if t.HasField("profile_gpu") and (where is None or where != (node.name, t.profile_gpu)):
            # Another pass of the job's (one the books stopped, or took back from
            # an agent's report): it is over, so its GPU is free.
            g = t.profile_gpu
            if node.holder.get(g) == rec.job_id and not self._explained(rec, node.name, g):
                del node.holder[g]
                self._capacity_changed(node)
            return
        if where is None or where[0] != node.name:
            return
        del rec.profiling[node.gpu_type]
        self.change_book.profile_changed.add(rec.job_id)
        if t.profile_refused:
            # It never ran (the agent's GPU was busy after all): it says nothing of the
            # job, which profiles again when GPUs next free up. Not signalled as
            # capacity: the same GPU would be offered, and refused, at once.
            if node.holder.get(where[1]) == rec.job_id:
                del node.holder[where[1]]
                # (a move waiting on it: at the next look)
                self.change_book.wake_nodes.add(node.name)
            if rec.state == pb.JOB_STATE_PROFILING:
                set_reason(rec, f"waiting: profiling on {node.gpu_type} ({t.profile_error})",
                           out)
            self.profile_book.to_profile[rec.job_id] = None
            self._share_result(profile_key(rec, node.gpu_type), at, out)
            return
        if node.holder.get(where[1]) == rec.job_id:
            del node.holder[where[1]]
            self._capacity_changed(node)
        rec.profiled.add(node.gpu_type)
        if t.profile_error:
            rec.profile_errors[node.gpu_type] = t.profile_error[:1000]  # what an agent sends
        if rec.grad is None and t.HasField("grad") and valid_grad(t.grad):
            rec.grad = GradParams(sqr=t.grad.sqr, var=t.grad.var)
        for s in t.samples:
            if valid_sample(s) and s.num_replicas == 1 and s.num_nodes == 1:
                sync = sync_part(s)
                rec.samples[(s.gpu_type, 1, 1, s.atomic_batch_size, 0)] = (s.step_time_s, sync)
                rec.estimator.add_profile(s.gpu_type, s.atomic_batch_size, s.step_time_s, sync)
                rec.usable.add(s.gpu_type)
        self._remember_profile(rec, node.gpu_type)
        self._share_result(profile_key(rec, node.gpu_type), at, out)
        out.append(Persist((rec.job_id,)))

    # ------------------------------------------------------------ reuse

    def _remember_profile(self, rec: JobRec, gpu_type: str) -> None:
        """Keep the job's 1-GPU profile of `gpu_type` (if it has one) for identical
        jobs: after its pass, and for a job reloaded from the store (a restart, a
        failover), so that identical jobs after it reuse it too."""
        points = tuple(sorted((bsz, step, sync) for (t, nodes, reps, bsz, accum), (step, sync)
                              in rec.samples.items()
                              if t == gpu_type and nodes == reps == 1 and accum == 0))
        if not points:
            return
        key, cache = profile_key(rec, gpu_type), self.profile_book.cache
        cache[key] = CachedProfile(points, rec.grad)
        cache.move_to_end(key)
        while len(cache) > self.settings.profile_cache_entries:
            cache.popitem(last=False)

    def _reuse_profiles(self, rec: JobRec, at: float, out: list[Action]) -> None:
        """A job identical to a profiled one (`profile_key`) takes its profiles
        rather than waiting for an idle GPU of each type: the same program on the
        same GPU type takes the same time a step. It is schedulable at once (an early
        round if GPUs are idle); types no identical job has profiled still get passes,
        one for all the identical jobs that want it (`_shared_pass`)."""
        if not self.settings.reuse_profiles or not self.profile_book.cache:
            return
        reused = []
        for gpu_type in sorted(self._profile_types(rec) - set(rec.profiling)):
            key = profile_key(rec, gpu_type)
            hit = self.profile_book.cache.get(key)
            if hit is None:
                continue
            self.profile_book.cache.move_to_end(key)
            for bsz, step, sync in hit.points:
                rec.samples[(gpu_type, 1, 1, bsz, 0)] = (step, sync)
            rec.estimator.add_profile(gpu_type, [p[0] for p in hit.points],
                                      [p[1] for p in hit.points], [p[2] for p in hit.points])
            rec.profiled.add(gpu_type)
            rec.usable.add(gpu_type)
            if rec.grad is None and hit.grad is not None:
                rec.grad = hit.grad
            reused.append(gpu_type)
        if not reused:
            return
        if not self._profile_types(rec):
            self.profile_book.to_profile.pop(rec.job_id, None)
        if rec.state == pb.JOB_STATE_PROFILING:
            set_state(rec, pb.JOB_STATE_QUEUED, at, "waiting: next scheduling round (profiles "
                      f"of {', '.join(reused)} reused from an identical job)")
            if self._idle_types_cached() & rec.usable:
                out.append(WantRound())
        out.append(Persist((rec.job_id,)))

    def _shared_pass(self, rec: JobRec, gpu_type: str) -> bool:
        """Whether an identical job's pass on `gpu_type` is in flight: then this job
        waits for its result (`_share_result`) instead of taking a GPU of its own, so
        a sweep of identical jobs submitted at once profiles each type once."""
        if not self.settings.reuse_profiles:
            return False
        key = profile_key(rec, gpu_type)
        if key in self.profile_book.cache and any(
                rec.job_id in w for w in self.profile_book.pass_waiters.values()):
            return True  # its result is in: taken with that of the pass it still waits for
        owner = self.job_book.jobs.get(self.profile_book.pass_owner.get(key, ""))
        if owner is None or owner is rec or gpu_type not in owner.profiling:
            return False
        self.profile_book.pass_waiters.setdefault(key, set()).add(rec.job_id)
        return True

    def _passes_abandoned(self, rec: JobRec, at: float, out: list[Action]) -> None:
        """An ended job's passes will report nothing: the identical jobs waiting for
        them take what is known, or profile themselves."""
        for gpu_type in sorted(rec.profiling):
            key = profile_key(rec, gpu_type)
            if self.profile_book.pass_owner.get(key) == rec.job_id:
                self._share_result(key, at, out)

    def _share_result(self, key: ProfileKey, at: float, out: list[Action]) -> None:
        """A pass ended: the identical jobs waiting for it take its profile if it
        gave one, else they want passes of their own again. A job still waiting for
        another type's pass takes them all once that one ends too, as the job that
        runs the passes becomes schedulable only when none is in flight (else the
        jobs that wait would be placed before the one that profiles for them)."""
        self.profile_book.pass_owner.pop(key, None)
        waiting = self.profile_book.pass_waiters.pop(key, set())
        others = self.profile_book.pass_waiters
        still = set().union(*others.values()) if others else set()
        for job_id in sorted(waiting):
            rec = self.job_book.jobs.get(job_id)
            if rec is None or rec.state in TERMINAL:
                continue
            if job_id not in still:
                self._reuse_profiles(rec, at, out)
            self.change_book.profile_changed.add(job_id)
        if waiting:
            self.change_book.freed_all = True  # (a failed pass: they look for GPUs again)

    def _reported_passes(self, node: NodeRec, ev: AgentRegistered, out: list[Action]) -> None:
        """Passes the agent says it runs: a pass the books lost track of (a partition,
        a controller restart) is taken back if the job still wants that type's
        profile and the GPU is free; any other is stopped, its GPU booked until then."""
        for job_id, gen, gpu in ev.profiling:
            rec = self.job_book.jobs.get(job_id)
            if gpu >= node.num_gpus or (rec is not None and (node.name, gpu) in
                                        rec.profiling.values()):
                continue
            if node.holder.get(gpu, job_id) != job_id:
                continue  # booked to another job: the agent refuses its RUN till then
            node.holder[gpu] = job_id
            if self._stop_pending(job_id, node.name):
                continue  # the STOP re-sent above ends it; its ack frees the GPU
            if (rec is not None and rec.state not in TERMINAL and node.gpu_type not in
                    rec.profiling and node.gpu_type in self._profile_types(rec)):
                rec.profiling[node.gpu_type] = (node.name, gpu)
                rec.pass_sent[node.gpu_type] = self.directive_book.next_id
            else:
                self._send_stop(job_id, gen, node.name, out)

    def _profile_types(self, rec: JobRec, present: set[str] | None = None) -> set[str]:
        """Types present in the cluster the job may use and has not profiled yet."""
        present = self._present_types() if present is None else present
        allowed = rec.res.allowed_types if rec.res.allowed_types is not None else present
        return {t for t in present & allowed
                if t not in rec.profiled and t in rec.res.local_bsz_limits}

    def _profiles_done(self, at: float, out: list[Action]) -> None:
        """A profiling job is schedulable once no pass is in flight and one type
        gave samples (waiting for every pass keeps a fast type's profile from
        placing it before the others are known); it fails if no type can run it.
        Only jobs whose passes changed since the last event are looked at."""
        changed, self.change_book.profile_changed = self.change_book.profile_changed, set()
        idle: set[str] | None = None  # computed when a job becomes schedulable
        for job_id in sorted(changed):
            rec = self.job_book.jobs.get(job_id)
            if rec is None or rec.state != pb.JOB_STATE_PROFILING or rec.profiling:
                continue
            if rec.usable:
                set_state(rec, pb.JOB_STATE_QUEUED, at, "waiting: next scheduling round")
                idle = self._idle_types_cached() if idle is None else idle
                if idle & rec.usable:  # else the next timer round does
                    out.append(WantRound())
                out.append(Persist((rec.job_id,)))
            elif rec.profiled and not self._profile_types(rec):
                # The agents' reasons (a command that is not found, a script that
                # crashed) are what the user must fix: `sia get` shows them.
                rec.job.status.message = "\n".join(
                    f"{t}: {e}" for t, e in sorted(rec.profile_errors.items()))
                self._finish(rec, pb.JOB_STATE_FAILED, at, "failed: no GPU type in the "
                             "cluster can run it (profiling found none)", out)

    def _want_profiles(self, job_ids: Iterable[str]) -> None:
        self.profile_book.to_profile.update(dict.fromkeys(job_ids))
        self.change_book.freed_all = True  # they may want a type whose idle GPUs nobody wanted

    def _start_profiles(self, out: list[Action]) -> None:
        """Give every job still missing a profile one idle GPU of that type.

        Only jobs in `ProfileBook.to_profile` are looked at, and only for the types whose GPUs
        were freed since the last look (all types when new passes are wanted): a GPU
        freed by one pass goes to the next job waiting for that type, without a scan
        of the whole cluster or of thousands of jobs waiting for other types."""
        marks = self.change_book
        if not self.profile_book.to_profile or not (marks.freed_all or marks.freed_types):
            return
        present = self._present_types()
        types = set(present) if marks.freed_all else marks.freed_types & present
        marks.freed_all, marks.freed_types = False, set()
        busy: set[tuple[str, int]] | None = None  # computed when first needed
        for job_id in list(self.profile_book.to_profile):
            if not types:
                return
            rec = self.job_book.jobs.get(job_id)
            if rec is None or rec.state in TERMINAL:
                del self.profile_book.to_profile[job_id]
                continue
            missing = self._profile_types(rec, present) - set(rec.profiling)
            if not missing:  # (a pass lost, or a new type, puts it back)
                del self.profile_book.to_profile[job_id]
                self._say_if_unprofilable(rec, out)
            for t in sorted(missing & types):
                if self._shared_pass(rec, t):
                    continue
                busy = self._reserved_gpus() if busy is None else busy
                slot = self._idle_gpu(t, busy)
                if slot is None:
                    types.discard(t)
                    continue
                node, gpu = slot
                busy.add(slot)
                self.node_book.nodes[node].holder[gpu] = rec.job_id
                rec.profiling[t] = (node, gpu)
                out.append(self._profile_request(rec, t, node, gpu))

    def _say_if_unprofilable(self, rec: JobRec, out: list[Action]) -> None:
        """A job with nothing to profile on (no ready node of a type it may use) waits
        saying so, rather than "profiling on each GPU type" for ever; a node of such a
        type joining puts it back in line (`_type_arriving`)."""
        if (rec.state == pb.JOB_STATE_PROFILING and not rec.profiling and not rec.usable
                and not self._profile_types(rec)):
            why = f"waiting: {self._type_gap(rec)}"
            set_reason(rec, why, out)

    def _profile_request(self, rec: JobRec, gpu_type: str, node: str, gpu: int) -> Send:
        rec.pass_sent[gpu_type] = self.directive_book.next_id
        self.profile_book.pass_owner[profile_key(rec, gpu_type)] = rec.job_id
        lo, hi = rec.res.local_bsz_limits[gpu_type]
        req = pb.ProfileRequest(
            job_id=rec.job_id, generation=rec.generation, spec=rec.job.spec,
            job_uid=rec.job.uid, local_gpu=gpu, local_batch_sizes=profile_batch_sizes(
                lo, hi, self.settings.profile_batch_sizes))
        return Send(node, pb.ControllerMessage(profile=req))

    def _profile_slots(self, cluster: Cluster, at: float, *,
                       early: bool) -> list[PolicyJob]:
        """One GPU per type that jobs have waited `profile_wait` to profile on and
        none is idle: a 1-GPU rigid job in the round, so the ILP decides whom to
        shrink for it. The GPU it gets is left to no one; released, it goes to the
        next waiting pass at once. Without this, a new job in a full cluster waits for
        some job to end. A job of a queue below its guarantee waits for no one: its
        slot is in the next round, early or timer (a reclaim is due within a round
        plus the checkpoints of the jobs that give way, and it cannot begin before
        the job is profiled); the others' only in timer rounds."""
        if not self.profile_book.to_profile:
            return []
        owed = self._queues_owed()
        wanted = set()
        for job_id in self.profile_book.to_profile:
            rec = self.job_book.jobs.get(job_id)
            if rec is None or rec.state != pb.JOB_STATE_PROFILING:
                continue
            waited = at - seconds(rec.job.status.create_time) >= self.settings.profile_wait
            if scheduled_in(self.queues, rec.job.spec)[0] in owed or (waited and not early):
                wanted |= self._profile_types(rec) - set(rec.profiling)
        idle = self._idle_types() if wanted else set()
        return [profile_slot(t) for t in sorted(wanted - idle) if t in cluster.gpu_types]

    def _queues_owed(self) -> set[str]:
        """The queues holding less than their guarantee (of some type, or in units)."""
        if not self.queues.guaranteed:
            return set()
        held, _, _ = self.queue_usage()
        return {q.name for q in self.queues.queues
                if any(held[q.name][t] < n for t, n in q.guarantee.items())
                or units(self.queues, held[q.name]) < q.guarantee_units}


def profile_slot(gpu_type: str) -> PolicyJob:
    """A stand-in for a profiling pass: worth one GPU of `gpu_type`, nothing else."""
    est = ThroughputEstimator()
    est.add_profile(gpu_type, 1, 1.0, 0.0)
    model = JobGoodputModel(estimator=est, grad=NEUTRAL_GRAD, init_batch_size=1,
                            max_batch_size=1, local_bsz_limits={gpu_type: (1, 1)})
    return PolicyJob(job_id=PROFILE_SLOT + gpu_type, model=model, adaptivity=Adaptivity.RIGID,
                     allowed_types=frozenset({gpu_type}), batch_size=1, num_gpus=1,
                     required=True)
