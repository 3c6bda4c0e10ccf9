"""Moving GPUs: two-phase moves (STOP, wait for every GPU of the target to be
released, then RUN the next generation), batch changes in place, preemptions and
requeues, directives and their acknowledgements, lost agents.

Changes: node_book, directive_book, change_book.
Every directive is numbered and remembered here (`_directive`); a RUN's rendezvous
port is booked on its master node (`NodeBook.ports`); a dispatch notes the epoch it
looked at. The line of moves itself is the ledger's (`GpuLedger._set_moving`)."""

from __future__ import annotations

import zlib

from sia_grpc.api import pb
from sia_grpc.api.convert import allocation_to_pb
from sia_grpc.controller.machine.books import StateBase
from sia_grpc.controller.machine.events import (
    Action,
    Happened,
    Persist,
    Send,
    WantRound,
)
from sia_grpc.controller.machine.records import (
    JobRec,
    by_node,
    live_rendezvous,
    timestamp,
)
from sia_grpc.controller.machine.transitions import TERMINAL, set_reason, set_state
from sia_grpc.names import job_checkpoint_path
from sia_grpc.policy.types import JobAllocation


class Moves(StateBase):
    """A part of `ControllerState`: moving GPUs (the module docstring)."""

    def _dispatch_pending(self, at: float, out: list[Action]) -> None:
        """Start every job whose target's GPUs are all released.

        Only the moves something changed for are looked at (`_woken_moves`): a freed
        GPU wakes the moves waiting on its node, not every move in the cluster, so a
        round that moves hundreds of jobs costs acks, not moves x acks."""
        if self.change_book.dispatch_scanned == self.change_book.epoch:
            return  # nothing freed, no move wanted or dropped: none can start now
        self.change_book.dispatch_scanned = self.change_book.epoch
        nodes = self.node_book.nodes
        for job_id in self._woken_moves():
            rec = self.job_book.jobs.get(job_id)
            if rec is None or not rec.moving or rec.state in TERMINAL:
                self._forget_move(job_id)
                continue
            if rec.held:
                continue  # woken again when it has released them all (`_release`)
            target = rec.target
            gone = target and sorted({g.node for g in target.gpus if g.node not in nodes
                                      or nodes[g.node].state != pb.NODE_STATE_READY})
            if gone:  # lost or drained since the round chose it: the move is void
                target = rec.target = None
                rec.next_reason = (f"requeued: {', '.join(gone)} left the pool before the "
                                   "move could start")
                out.append(WantRound("requeue"))
            if target is None:  # preempted, and now fully stopped
                self._set_moving(rec, False)
                self._account(rec, at)
                rec.alloc = None
                rec.job.status.ClearField("allocation")
                set_state(rec, pb.JOB_STATE_QUEUED, at, rec.next_reason or "preempted")
                out.append(Persist((rec.job_id,)))
                continue
            # Free in the books, and on nodes whose agents have said what runs there
            # (`NodeRec.bookable`): a restored node's agent may report a pass there.
            if any(nodes[g.node].holder.get(g.index) is not None
                   or not nodes[g.node].bookable for g in target.gpus):
                self._wait_on(job_id, {g.node for g in target.gpus})
                continue
            self._run(rec, target, at, out)

    def _run(self, rec: JobRec, alloc: JobAllocation, at: float, out: list[Action]) -> None:
        self._account(rec, at)
        rec.generation += 1
        rec.alloc, rec.target = alloc, None
        self._set_moving(rec, False, started=True)
        rec.run_since = rec.started_at = at
        status = rec.job.status
        status.generation = rec.generation
        status.allocation.CopyFrom(allocation_to_pb(alloc))
        status.goodput = alloc.goodput
        if not status.HasField("start_time"):
            status.start_time.CopyFrom(timestamp(at))
        for name, gpus in by_node(alloc):
            self.node_book.nodes[name].holder.update(dict.fromkeys(gpus, rec.job_id))
            rec.held[name], rec.held_gen[name] = gpus, rec.generation
        out.extend(self._run_directives(rec))
        set_state(rec, pb.JOB_STATE_RUNNING, at, rec.next_reason or "running")
        rec.next_reason = ""
        out.append(Persist((rec.job_id,)))

    def _rebatch(self, rec: JobRec, alloc: JobAllocation, out: list[Action]) -> None:
        """Same GPUs, new batch size: the workers change it between steps, no restart
        (a RUN of the same generation with the new allocation)."""
        rec.alloc = alloc
        rec.job.status.allocation.CopyFrom(allocation_to_pb(alloc))
        rec.job.status.goodput = alloc.goodput
        out.extend(self._run_directives(rec))
        out.append(Persist((rec.job_id,)))

    def _run_directives(self, rec: JobRec) -> list[Send]:
        """A RUN of the job's current generation and allocation for each of its nodes."""
        assert rec.alloc is not None  # (called for a job with an allocation to run)
        layout = by_node(rec.alloc)
        nodes = [name for name, _ in layout]
        world = sum(len(g) for _, g in layout)
        port = self._master_port(rec, nodes[0])
        sends, offset = [], 0
        for name, gpus in layout:
            sends.append(self._directive(name, pb.Directive(
                round=self.round_book.round_no, job_id=rec.job_id, generation=rec.generation,
                action=pb.Directive.ACTION_RUN, spec=rec.job.spec, local_gpus=gpus,
                world=pb.WorldLayout(world_size=world, rank_offset=offset, master_addr=nodes[0],
                                     master_port=port, nodes=nodes),
                allocation=rec.job.status.allocation,
                checkpoint_path=job_checkpoint_path(self.settings.checkpoint_root,
                                                    rec.job.spec.tenant, rec.job_id,
                                                    rec.job.uid),
                restore_progress=rec.checkpoint, job_uid=rec.job.uid)))
            offset += len(gpus)
        return sends

    def _master_port(self, rec: JobRec, master: str) -> int:
        """The rendezvous port of the job's generation on its master node: a hash of
        the generation in a range of 1,000, moved on past any port another job's
        live generation rendezvouses at on the same node (two stores on one port:
        the later job's rank 0 fails with EADDRINUSE). Not persisted: after a
        restart a RUN sent again for a running generation is hashed anew, which is
        the same port unless it had been moved on."""
        if rec.rendezvous is not None and rec.rendezvous[:2] == (master, rec.generation):
            return rec.rendezvous[2]
        taken = self.node_book.ports.setdefault(master, {})
        start = zlib.crc32(f"{rec.job_id}/{rec.generation}".encode()) % 1000
        for k in range(1000):
            port = self.settings.master_port_base + (start + k) % 1000
            other = self.job_book.jobs.get(taken.get(port, ""))
            if other is None or other is rec or live_rendezvous(other) != (master, port):
                break
        taken[port] = rec.job_id
        rec.rendezvous = (master, rec.generation, port)
        return port

    def _stop_everywhere(self, rec: JobRec, out: list[Action], except_node: str = "") -> None:
        for name in rec.held:
            if name != except_node and name not in rec.stopping:
                rec.stopping.add(name)
                self._send_stop(rec.job_id, rec.generation, name, out)

    def _stop_passes(self, rec: JobRec, out: list[Action]) -> None:
        """An ended job's profiling passes are stopped, not left to finish: the
        record may be deleted before a pass reports, and a pending STOP is what
        frees the GPU then (its ack, `_ack`)."""
        for name in sorted({n for n, _ in rec.profiling.values()} - rec.stopping):
            rec.stopping.add(name)
            self._send_stop(rec.job_id, rec.generation, name, out)

    def _send_stop(self, job_id: str, generation: int, node: str, out: list[Action]) -> None:
        out.append(self._directive(node, pb.Directive(
            round=self.round_book.round_no, job_id=job_id, generation=generation,
            action=pb.Directive.ACTION_STOP)))

    def _interrupt(self, rec: JobRec, at: float, reason: str, out: list[Action]) -> None:
        """Its allocation broke (node lost, workers gone): requeue from its checkpoint."""
        if rec.state in TERMINAL:
            return
        self._account(rec, at)
        rec.alloc, rec.target = None, None
        self._set_moving(rec, bool(rec.held))
        if rec.held:
            self._stop_everywhere(rec, out)
        rec.job.status.ClearField("allocation")
        rec.begin_restart(at)
        rec.generation += 1  # fence whatever still runs of the old generation
        rec.job.status.generation = rec.generation
        set_state(rec, pb.JOB_STATE_QUEUED, at, reason)
        out.append(Persist((rec.job_id,)))
        out.append(WantRound("requeue"))

    def _unplaceable(self, rec: JobRec, ready: set[str], at: float, out: list[Action]) -> None:
        """A job no ready node can run (none of its types is there). It waits, saying
        why; if it still holds GPUs on a node that left the pool (drained), it is
        checkpointed and requeued, so the drain completes."""
        why = self._type_gap(rec)
        # (GPUs held on nodes it is being stopped on, a fenced generation's, are
        # freed by those STOPs' acks: nothing there to checkpoint.)
        left = sorted(set(rec.held) - ready - rec.stopping)
        if rec.moving or not left:
            if rec.state == pb.JOB_STATE_QUEUED and not rec.moving:
                set_reason(rec, f"waiting: {why}", out)
            return
        rec.target = None
        self._set_moving(rec, True)
        rec.begin_restart(at)
        self._stop_everywhere(rec, out)
        rec.next_reason = f"requeued: {', '.join(left)} left the pool and {why}"
        set_state(rec, pb.JOB_STATE_RESTARTING, at, f"checkpointing: {rec.next_reason}")
        out.append(Persist((rec.job_id,)))

    def _directive(self, node: str, d: pb.Directive) -> Send:
        """Number the directive, remember it until acknowledged, and send it."""
        self.directive_book.next_id += 1
        d.directive_id = self.directive_book.next_id
        self.directive_book.round_acks.setdefault(d.round, set()).add(d.directive_id)
        msg = pb.ControllerMessage(directive=d)
        self.directive_book.pending[d.directive_id] = (d.job_id, node, d.action, msg)
        if d.action == pb.Directive.ACTION_STOP:
            self.directive_book.stops_due[d.job_id, node] += 1
        return Send(node, msg)

    def _account(self, rec: JobRec, at: float) -> None:
        """Credit the time it held its allocation (Gavel's time shares)."""
        if rec.alloc is not None and rec.run_since is not None:
            t = rec.alloc.config.gpu_type
            rec.attained[t] = rec.attained.get(t, 0.0) + max(at - rec.run_since, 0.0)
        rec.run_since = at if rec.alloc is not None else None

    @staticmethod
    def _attained(rec: JobRec, at: float) -> dict[str, float]:
        """Time held per GPU type up to `at`, the current stint included."""
        out = dict(rec.attained)
        if rec.alloc is not None and rec.run_since is not None:
            t = rec.alloc.config.gpu_type
            out[t] = out.get(t, 0.0) + max(at - rec.run_since, 0.0)
        return out

    def _check_liveness(self, at: float, out: list[Action]) -> None:
        for node in self.node_book.nodes.values():
            if node.state == pb.NODE_STATE_LOST:
                continue
            if at - node.last_seen > self.settings.heartbeat_timeout:
                node.state = pb.NODE_STATE_LOST
                held = sorted(set(node.holder.values()))
                out.append(Happened(
                    at, pb.EVENT_KIND_NODE_LOST,
                    f"node {node.name} lost: no message for {at - node.last_seen:.0f} s "
                    f"(heartbeat_timeout {self.settings.heartbeat_timeout:g} s); its "
                    f"{node.num_gpus} {node.gpu_type} GPUs left the pool; it held "
                    + (", ".join(held) + " (requeued)" if held else "no job"),
                    node=node.name))
                for job_id in held:
                    rec = self.job_book.jobs.get(job_id)
                    if rec is None:
                        continue
                    for t, (n, _) in list(rec.profiling.items()):
                        if n == node.name:
                            del rec.profiling[t]
                            self._want_profiles((job_id,))
                    if node.name not in rec.held:  # (a pass being stopped: gone with it)
                        rec.stopping.discard(node.name)
                    if node.name in rec.held:
                        self._release(rec, node.name)
                        if rec.alloc is not None and not rec.moving:
                            self._interrupt(rec, at, f"requeued: node {node.name} lost", out)
                node.holder.clear()
                self._capacity_changed(node)

