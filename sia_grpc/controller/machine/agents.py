"""What agents say: registration and reconciliation (their workers, passes and
drain state against the books), telemetry, acknowledgements, exits.

Changes: node_book, directive_book.
Registering adds or updates a node; an acknowledgement settles its directive (and
counts a refused RUN). The rest goes through the other parts: releases (`ledger`),
requeues and STOPs (`moves`), passes (`profiling`), ends (`state`)."""

from __future__ import annotations

import collections
import math

from sia_grpc.api import pb
from sia_grpc.api.convert import MAX_GPUS_PER_NODE
from sia_grpc.controller.machine.books import StateBase
from sia_grpc.controller.machine.events import (
    Action,
    AgentDisconnected,
    AgentMessage,
    AgentRegistered,
    Happened,
    Persist,
    Reconnect,
    Send,
)
from sia_grpc.controller.machine.records import (
    NodeRec,
    sync_part,
    valid_grad,
    valid_sample,
)
from sia_grpc.controller.machine.transitions import TERMINAL
from sia_grpc.models.efficiency import GradParams
from sia_grpc.policy.cluster import Node


class Agents(StateBase):
    """A part of `ControllerState`: what agents say (the module docstring)."""

    def _registered(self, ev: AgentRegistered, out: list[Action]) -> None:
        """An agent (re)registers: its node is booked as it says, then what it runs is
        reconciled with the books, both ways."""
        node = self._take_node(ev, out)
        if node is None:
            return
        self._lost_gpus(node, ev, out)
        node.state, node.last_seen = self._up_state(node.name), ev.at
        self._capacity_changed(node)
        # Its drain state, where the agent's differs: one that restarted forgot a
        # drain, one whose stream broke may have missed its end.
        if ev.draining != (node.name in self.node_book.drained):
            out.append(self._drain_message(node.name))
        reported = {job: (gen, gpus) for job, gen, gpus in ev.running}
        unacked = self._redeliver(ev, out)
        self._resend_passes(node, ev, out)
        self._gone_workers(node, ev, set(reported) | unacked, out)
        self._fence_strays(node, ev, reported, unacked, out)
        self._reported_passes(node, ev, out)

    def _take_node(self, ev: AgentRegistered, out: list[Action]) -> NodeRec | None:
        """The node's record, as the agent registers it; None (its stream ended) for a
        node the policy's cluster could not hold: else every round fails on it."""
        try:
            Node(ev.node_id, ev.gpu_type, ev.num_gpus)
            if ev.num_gpus > MAX_GPUS_PER_NODE:
                raise ValueError(f"num_gpus: at most {MAX_GPUS_PER_NODE}, got {ev.num_gpus}")
        except ValueError:
            out.append(Reconnect(ev.node_id))  # not taken: its stream is ended
            return None
        node = self.node_book.nodes.get(ev.node_id)
        self._type_arriving(ev.gpu_type)
        was = ("" if node is None else " again, to a new leader" if node.restored else
               " back after being lost" if node.state == pb.NODE_STATE_LOST
               else " again (reconnected)")
        out.append(Happened(ev.at, pb.EVENT_KIND_NODE_REGISTERED,
                            f"node {ev.node_id} registered{was}: {ev.num_gpus} {ev.gpu_type} "
                            f"GPUs, agent {ev.version or '?'}, isolation {ev.isolation or '?'}",
                            node=ev.node_id))
        if node is None:
            node = self.node_book.nodes[ev.node_id] = NodeRec(ev.node_id, ev.gpu_type, ev.num_gpus)
        node.gpu_type, node.num_gpus, node.version = ev.gpu_type, ev.num_gpus, ev.version
        node.isolation = ev.isolation
        node.restored = False  # (its report settles the restored books: `_registered`)
        return node

    def _lost_gpus(self, node: NodeRec, ev: AgentRegistered, out: list[Action]) -> None:
        # Back with fewer GPUs (one failed, the agent was reconfigured): whatever was
        # booked on the missing ones is gone; a pass there is run again, a job requeued.
        for g in sorted(g for g in node.holder if g >= node.num_gpus):
            rec = self.job_book.jobs.get(node.holder.pop(g, ""))  # (a release may have taken it)
            self._capacity_changed(node)
            if rec is None:
                continue
            for t, (name, gpu) in list(rec.profiling.items()):
                if (name, gpu) == (node.name, g):
                    del rec.profiling[t]
                    self._want_profiles((rec.job_id,))
            if node.name in rec.held:
                stopping = node.name in rec.stopping
                self._release(rec, node.name)
                if not stopping:
                    self._interrupt(rec, ev.at, f"requeued: {node.name} lost GPU {g}", out)

    def _redeliver(self, ev: AgentRegistered, out: list[Action]) -> set[str]:
        """The jobs whose directives to this node are still unacknowledged."""
        # Re-deliver what it may have missed; the agent ignores ids it already applied.
        unacked: set[str] = set()
        for did, (job_id, name, action, msg) in list(self.directive_book.pending.items()):
            if name != ev.node_id:
                continue
            rec = self.job_book.jobs.get(job_id)
            d = msg.directive
            if action == pb.Directive.ACTION_RUN and (
                    rec is None or rec.state in TERMINAL or d.generation != rec.generation
                    or ev.node_id not in rec.held):
                # Obsolete: the job moved on while the agent was away. Sent now, it
                # would start a fenced generation on GPUs the books give to others.
                del self.directive_book.pending[did]
                self._round_acked(d.round, did)
                continue
            unacked.add(job_id)
            out.append(Send(name, msg))
        return unacked

    def _resend_passes(self, node: NodeRec, ev: AgentRegistered, out: list[Action]) -> None:
        # Profiling passes booked here that the agent does not report: the request may
        # have been lost with the old stream (or the agent restarted), and nothing
        # else would ever end the pass. Sent again. Not one it reports: that one runs,
        # or its report comes right behind the Register (`NodeAgent._register_message`),
        # and a second pass of the same job on that GPU would be left unbooked when
        # that report, taken for the second pass's, freed the GPU.
        # (An ended job's passes are being stopped: its STOP is re-sent above.)
        reported_passes = {(job_id, gpu) for job_id, _, gpu in ev.profiling}
        for job_id in sorted(set(node.holder.values())):
            rec = self.job_book.jobs.get(job_id)
            if rec is None or rec.state in TERMINAL:
                continue
            for t, (name, gpu) in sorted(rec.profiling.items()):
                if name == ev.node_id and (job_id, gpu) not in reported_passes:
                    out.append(self._profile_request(rec, t, name, gpu))

    def _gone_workers(self, node: NodeRec, ev: AgentRegistered, known: set[str],
                      out: list[Action]) -> None:
        """`known`: the jobs the agent reports running, or has directives pending for."""
        # Jobs we believe run here but the agent does not have: their workers are gone.
        # (Also jobs whose restored books name this node while another job's booking
        # of the same GPU won: the agent's report settles it.)
        for job_id in sorted({*node.holder.values(),
                              *(j for j, r in self.job_book.jobs.items() if ev.node_id in r.held)}):
            rec = self.job_book.jobs.get(job_id)
            if rec is None or job_id in known:
                continue
            if ev.node_id in rec.held and ev.node_id not in rec.stopping:
                self._release(rec, ev.node_id)
                self._interrupt(rec, ev.at, f"requeued: its workers on {ev.node_id} are gone", out)
            elif ev.node_id in rec.stopping:  # it stopped while we were apart
                self._release(rec, ev.node_id)

    def _fence_strays(self, node: NodeRec, ev: AgentRegistered,
                      reported: dict[str, tuple[int, tuple[int, ...]]], unacked: set[str],
                      out: list[Action]) -> None:
        # Workers the agent runs that we did not place there (or of an older generation): fence.
        for job_id, (gen, gpus) in reported.items():
            if job_id in unacked:
                continue
            rec = self.job_book.jobs.get(job_id)
            ours = (rec is not None and rec.state not in TERMINAL and gen == rec.generation
                    and rec.held.get(ev.node_id) == tuple(sorted(gpus)))
            if not ours:
                # Only GPUs the node has, and not booked for another job: an agent's
                # report must not push its GPU count past what it registered.
                mine = tuple(sorted({g for g in gpus if g < node.num_gpus
                                     and node.holder.get(g, job_id) == job_id}))
                node.holder.update(dict.fromkeys(mine, job_id))
                self._send_stop(job_id, gen, ev.node_id, out)
                if rec is not None:
                    if ev.node_id not in rec.held:
                        rec.held[ev.node_id], rec.held_gen[ev.node_id] = mine, gen
                    rec.stopping.add(ev.node_id)

    def _agent_message(self, ev: AgentMessage, out: list[Action]) -> None:
        node = self.node_book.nodes.get(ev.node_id)
        if node is None:
            return
        if node.state == pb.NODE_STATE_LOST:
            out.append(Reconnect(node.name))
            return
        node.last_seen = ev.at
        msg = ev.message
        kind = msg.WhichOneof("kind")
        if kind == "telemetry":
            self._telemetry(node, msg.telemetry, ev.at, out)
        elif kind == "ack":
            if msg.ack.HasField("exit"):  # (a STOP's exit, sent with its ack: read first)
                self._exit(node, msg.ack.exit, ev.at, out)
            self._ack(node, msg.ack, ev.at, out)
        elif kind == "exit":
            self._exit(node, msg.exit, ev.at, out)

    def _telemetry(self, node: NodeRec, t: pb.Telemetry, at: float, out: list[Action]) -> None:
        rec = self.job_book.jobs.get(t.job_id)
        if rec is None:  # a deleted job's pass that ran to its end: its GPU is free
            g = t.profile_gpu if t.profile and t.HasField("profile_gpu") else -1
            if g in node.holder and node.holder[g] == t.job_id:
                del node.holder[g]
                self._capacity_changed(node)
            return
        if t.profile:
            self._profiled(rec, node, t, at, out)
            return
        if t.generation != rec.generation or rec.state in TERMINAL:
            return  # a fenced generation's late report
        new_shape = False
        samples = [s for s in t.samples if valid_sample(s)]
        for s in samples:
            key = (s.gpu_type, s.num_nodes, s.num_replicas, s.atomic_batch_size, s.accum_steps)
            old = rec.samples.get(key)
            # A new shape, or one whose step time moved by more than 5% (a real
            # worker warms up; modeled ones repeat themselves): fit it again.
            if old is None or abs(s.step_time_s - old[0]) > 0.05 * old[0]:
                sync = sync_part(s)
                rec.samples[key] = (s.step_time_s, sync)
                rec.estimator.add_observation(s.gpu_type, s.num_nodes, s.num_replicas,
                                              s.atomic_batch_size, s.accum_steps,
                                              s.step_time_s, sync)
                new_shape = True
        if t.HasField("grad") and valid_grad(t.grad):
            rec.grad = GradParams(sqr=t.grad.sqr, var=t.grad.var)
        rec.job.status.progress = max(rec.job.status.progress, min(t.progress, 1.0))
        # Its throughput goes out with the progress (the Persist below, at most every
        # `persist_progress_every`); the end of a restart, with its cost, at once.
        if rec.reported(samples, at):
            new_shape = True
        if t.HasField("checkpoint"):
            c = t.checkpoint
            rec.checkpoint = max(rec.checkpoint, c.progress)
            if c.restore_s > 0 and math.isfinite(c.restore_s + c.save_s):
                # The restart cost the policy weighs is measured, not guessed.
                rec.restart_cost = min(max(c.save_s, 0.0) + c.restore_s, 86400.0)
                new_shape = True
        if new_shape or at - rec.last_persist >= self.settings.persist_progress_every:
            rec.last_persist = at
            out.append(Persist((rec.job_id,)))

    def _ack(self, node: NodeRec, ack: pb.DirectiveAck, at: float, out: list[Action]) -> None:
        pending = self.directive_book.pending.get(ack.directive_id)
        if pending is None or pending[1] != node.name:
            return  # a re-delivered directive's second ack (or another node's: ignored)
        del self.directive_book.pending[ack.directive_id]
        if pending[2] == pb.Directive.ACTION_STOP:
            key = pending[0], pending[1]
            self.directive_book.stops_due[key] -= 1
            if self.directive_book.stops_due[key] <= 0:
                del self.directive_book.stops_due[key]
        self._round_acked(pending[3].directive.round, ack.directive_id)
        job_id, node_id, action, msg = pending
        rec = self.job_book.jobs.get(job_id)
        if action == pb.Directive.ACTION_STOP:
            self._stopped(rec, node, job_id, msg.directive.generation, ack.directive_id)
        elif rec is None:
            return
        elif not ack.ok and ack.generation == rec.generation and node_id in rec.held:
            # The agent refused to start it (bad GPUs, draining): run it elsewhere, and
            # tell it again whether it is drained (it may have missed the news).
            self.directive_book.refused += 1
            out.append(self._drain_message(node_id))
            self._release(rec, node_id)
            self._interrupt(rec, at, f"requeued: {node_id} refused it: {ack.error}", out)

    def _disconnected(self, ev: AgentDisconnected) -> None:
        """Liveness is judged by heartbeats (Tick), so a quick reconnect is free: its
        directives stay pending and are sent again when it registers. But no round
        waits for an agent that is gone: the rounds waiting on its acknowledgements
        finish now (in order, not after the heartbeat timeout), noted interrupted."""
        waiting: collections.Counter[int] = collections.Counter()
        for did, (_, node, _, msg) in self.directive_book.pending.items():
            acks = self.directive_book.round_acks.get(msg.directive.round)
            if node == ev.node_id and acks is not None and did in acks:
                acks.discard(did)
                waiting[msg.directive.round] += 1
        for round_no, n in waiting.items():
            self.directive_book.interrupted[round_no] = (
                f"interrupted: {ev.node_id} disconnected before acknowledging {n} "
                "directive(s); they are sent again when it reconnects")

    def _round_acked(self, round_no: int, directive_id: int) -> None:
        self.directive_book.round_acks.get(round_no, set()).discard(directive_id)

    def _exit(self, node: NodeRec, ex: pb.JobExit, at: float, out: list[Action]) -> None:
        rec = self.job_book.jobs.get(ex.job_id)
        if rec is None or node.name not in rec.held:
            return  # only a node the job runs on may end it (or report its checkpoint)
        if ex.kind == pb.JobExit.KIND_CHECKPOINTED:
            rec.checkpoint = max(rec.checkpoint, ex.progress)
            rec.job.status.progress = max(rec.job.status.progress, ex.progress)
            return
        if ex.generation != rec.generation or rec.state in TERMINAL:
            return
        # A RUN still on its way there (a batch change) would start the finished job
        # again: then its GPUs stay booked until a STOP behind that RUN is acknowledged.
        rerun = any(j == rec.job_id and n == node.name and act == pb.Directive.ACTION_RUN
                    for j, n, act, _ in self.directive_book.pending.values())
        done_here = "" if rerun else node.name
        if not rerun:
            self._release(rec, node.name)
        if ex.kind == pb.JobExit.KIND_COMPLETED:
            rec.job.status.progress = 1.0
            self._finish(rec, pb.JOB_STATE_SUCCEEDED, at, "completed", out, except_node=done_here)
        elif rec.failures < self.settings.job_retries:
            # Retried from its checkpoint, anywhere the next round puts it; what failed
            # is in the reason (the message, which `sia ls` shows first, is for the end).
            rec.failures += 1
            first = (ex.message or "worker failed").strip().splitlines() or ["worker failed"]
            self._interrupt(rec, at, f"requeued: its workers failed on {node.name} (retry "
                            f"{rec.failures} of {self.settings.job_retries}): "
                            f"{first[0][:200]}", out)
        else:
            msg = ex.message or "worker failed"
            rec.job.status.message = msg
            after = f" (after {rec.failures} retries)" if rec.failures else ""
            self._finish(rec, pb.JOB_STATE_FAILED, at, f"failed: {msg}{after}", out,
                         except_node=done_here)
