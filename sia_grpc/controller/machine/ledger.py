"""The GPU ledger: who holds which GPU, and the caches that say when GPUs may have
become idle.

The books: `NodeRec.holder` (GPU index → the job physically on it), and per job
`held` (node → its GPUs there), `held_gen` (the generation they were taken for),
`stopping` (nodes a STOP is due on) and `profiling` (type → the pass's node and
GPU); `DirectiveBook.stops_due` indexes the STOPs in flight. A GPU is freed only by
the event that proves it: a STOP's ack (`_stopped`), a pass's result, an agent lost.
The capacity epoch and the freed types (`ChangeBook`) let the scans that look for
work (moves to start, passes to begin) run only when something they depend on
changed; the woken jobs and nodes say which moves such a scan looks at
(`Moves._dispatch_pending`).

Changes: move_book, change_book.
The line of moves and what each waits on, and every mark of what changed."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from sia_grpc.api import pb
from sia_grpc.controller.machine.books import StateBase
from sia_grpc.controller.machine.records import (
    JobRec,
    NodeRec,
)
from sia_grpc.controller.machine.transitions import TERMINAL


class GpuLedger(StateBase):
    """A part of `ControllerState`: the GPU ledger (the module docstring)."""

    def _release(self, rec: JobRec, node_name: str) -> None:
        gpus = rec.held.pop(node_name, ())
        rec.held_gen.pop(node_name, None)
        rec.stopping.discard(node_name)
        self.change_book.released.add(rec.job_id)
        self.change_book.wake_jobs.add(rec.job_id)  # (all released: its move may start)
        node = self.node_book.nodes.get(node_name)
        if node is not None:
            for g in gpus:
                if node.holder.get(g) == rec.job_id:
                    del node.holder[g]
                    self._capacity_changed(node)

    def _stopped(self, rec: JobRec | None, node: NodeRec, job_id: str, generation: int,
                 stop_id: int) -> None:
        """An acknowledged STOP: the agent has stopped the job's workers of that
        generation or older on the node, and its passes there. What they held is
        free, and so is anything else booked to the job on that node (a fenced
        stale worker, a pass of a deleted job) — unless a newer generation of the
        job has been started there since (a late ack of an older STOP)."""
        if rec is not None:
            self._passes_ended(rec, node.name, stop_id)
            if generation >= rec.held_gen.get(node.name, -1):
                self._release(rec, node.name)
            if self._stop_pending(job_id, node.name):  # a later STOP there is still due
                rec.stopping.add(node.name)
        for g in [g for g, j in node.holder.items() if j == job_id and not self._explained(
                rec, node.name, g)]:
            del node.holder[g]
            self._capacity_changed(node)

    def _stop_pending(self, job_id: str, node: str) -> bool:
        return self.directive_book.stops_due[job_id, node] > 0

    @staticmethod
    def _explained(rec: JobRec | None, node: str, gpu: int) -> bool:
        """Whether `rec` runs or profiles on node/gpu (a booking it may keep)."""
        return rec is not None and (gpu in rec.held.get(node, ())
                                    or (node, gpu) in rec.profiling.values())

    def _passes_ended(self, rec: JobRec, node_id: str, stop_id: int) -> None:
        """A STOP acknowledged ends the job's passes on that node requested before it
        (the agent stops them first): their GPUs are free; a live job profiles again."""
        node = self.node_book.nodes.get(node_id)
        for t, (name, gpu) in list(rec.profiling.items()):
            if name != node_id or rec.pass_sent.get(t, 0) >= stop_id:
                continue
            del rec.profiling[t]
            self.change_book.profile_changed.add(rec.job_id)
            if rec.state not in TERMINAL:
                self._want_profiles((rec.job_id,))
            if node is not None and node.holder.get(gpu) == rec.job_id:
                del node.holder[gpu]
                self._capacity_changed(node)

    def _reserved_gpus(self) -> set[tuple[str, int]]:
        """GPUs a pending RUN will take (those held already are in node.holder)."""
        return {(g.node, g.index) for j in self.move_book.moving if (r := self.job_book.jobs.get(j))
                and r.target is not None for g in r.target.gpus}

    def _idle_types(self, reserved: set[tuple[str, int]] | None = None) -> set[str]:
        """GPU types with a GPU nobody holds or is about to take."""
        per_node = collections.Counter(
            node for node, _ in (self._reserved_gpus() if reserved is None else reserved))
        return {n.gpu_type for n in self.node_book.nodes.values() if n.bookable
                and len(n.holder) + per_node.get(n.name, 0) < n.num_gpus}

    def _idle_types_cached(self) -> set[str]:
        """`_idle_types()` as of the last time GPUs were freed: GPUs taken since may
        make it too generous, never too strict (for asking for an early round,
        where a round too many costs one solve that places nothing)."""
        if self.change_book.idle_cache[0] != self.change_book.epoch:
            self.change_book.idle_cache = (self.change_book.epoch, self._idle_types())
        return self.change_book.idle_cache[1]

    def _set_moving(self, rec: JobRec, moving: bool, *, started: bool = False) -> None:
        rec.moving = moving
        if moving:
            # (a job moved again keeps its place in line: dispatch order is first come)
            if rec.job_id not in self.move_book.moving:
                self.move_book.seq += 1
                self.move_book.moving[rec.job_id] = self.move_book.seq
            self.change_book.wake_jobs.add(rec.job_id)
        else:
            self._forget_move(rec.job_id)
        if not started:  # a move wanted, or its reserved GPUs given up
            self._capacity_changed()

    def _forget_move(self, job_id: str) -> None:
        self.move_book.moving.pop(job_id, None)
        self._wait_on(job_id, ())

    def _wait_on(self, job_id: str, nodes: Iterable[str]) -> None:
        """Index a move that cannot start yet by the nodes its target needs: a GPU
        freed there (or the node leaving) wakes it; others leave it alone."""
        for name in self.move_book.waits.pop(job_id, ()):
            waiting = self.move_book.waiting_on[name]
            waiting.discard(job_id)
            if not waiting:
                del self.move_book.waiting_on[name]
        nodes = tuple(nodes)
        if nodes:
            self.move_book.waits[job_id] = nodes
            for name in nodes:
                self.move_book.waiting_on.setdefault(name, set()).add(job_id)

    def _woken_moves(self) -> list[str]:
        """The moves to look at, in dispatch order: those whose own record changed,
        and those waiting on a node whose GPUs or state changed, since the last look.
        Any other cannot start now: nothing it waits on has changed."""
        woken = self.change_book.wake_jobs
        for name in self.change_book.wake_nodes:
            woken.update(self.move_book.waiting_on.get(name, ()))
        self.change_book.wake_jobs, self.change_book.wake_nodes = set(), set()
        moving = self.move_book.moving
        return sorted((j for j in woken if j in moving), key=moving.__getitem__)

    def _capacity_changed(self, node: NodeRec | None = None) -> None:
        """GPUs of `node` (or None: of any type) may have become idle, or the node
        changed state: the moves waiting on it are looked at again."""
        self.change_book.epoch += 1
        if node is not None:
            self.change_book.wake_nodes.add(node.name)
        if node is not None and node.gpu_type:
            self.change_book.freed_types.add(node.gpu_type)
        else:  # (a restored node whose type its agent has not said yet: any type)
            self.change_book.freed_all = True

    def _idle_gpu(self, gpu_type: str, busy: set[tuple[str, int]]) -> tuple[str, int] | None:
        for node in self.node_book.nodes.values():
            if node.gpu_type != gpu_type or not node.bookable:
                continue
            for g in range(node.num_gpus):
                if g not in node.holder and (node.name, g) not in busy:
                    return node.name, g
        return None

    def _present_types(self) -> set[str]:
        return {n.gpu_type for n in self.node_book.nodes.values() if n.state == pb.NODE_STATE_READY}
