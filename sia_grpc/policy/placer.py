"""Placement: turning each job's `Config` into physical GPUs.

Sia decouples allocation (how many GPUs of which type: the policy's ILP) from
placement (which GPUs: this module). Per GPU type, with virtual nodes of R GPUs:

* a *partial* allocation (one node, fewer than R GPUs) lies inside one virtual node;
* a *whole-node* allocation (a multiple of R GPUs) takes that many entire virtual
  nodes and shares them with nobody, so distributed jobs never contend for a NIC;
* a job whose allocation is unchanged keeps its GPUs, because moving means a restart;
* when fragmentation blocks a placement, a few kept jobs are evicted (moved), the
  `pinned` ones (a queue's minimum runtime) only where nothing else makes room.

Every size is a power of two dividing R or a multiple of R, so placing whole-node
jobs first and then partial jobs largest-first always succeeds when the per-type
totals fit (the Submesh Shape Covering argument). The same order keeps evictions
small and makes them terminate: a partial job of size g only ever evicts kept jobs
smaller than g, which are then placed later in the same pass. Inside a virtual
node GPUs are interchangeable, so only per-virtual-node free counts are tracked
during the search and concrete GPU indices are handed out at the end.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sia_grpc.policy.cluster import Cluster, Config, GpuId, VirtualNode

__all__ = ["PlacementError", "PlacementResult", "place"]


class PlacementError(ValueError):
    """The allocations cannot be placed: a config outside the set or a type over capacity."""


@dataclass(frozen=True)
class PlacementResult:
    placements: Mapping[str, tuple[GpuId, ...]]  # job -> its GPUs, sorted; keys sorted
    # Jobs whose GPU set differs from `previous` (new jobs included): they (re)start.
    moved: frozenset[str]
    # Jobs with an unchanged allocation that still had to move because of fragmentation.
    evicted: frozenset[str]


def place(
    cluster: Cluster,
    allocations: Mapping[str, Config],
    previous: Mapping[str, Sequence[GpuId]] | None = None,
    pinned: frozenset[str] = frozenset(),
) -> PlacementResult:
    """Place every job of `allocations`; jobs only in `previous` release their GPUs.
    A kept job in `pinned` is evicted only where no other eviction makes room.

    Deterministic: the result depends only on the contents of the arguments.

    Jobs are handled as their positions in id order, in lists aligned with it: at
    20,000 jobs the dict lookups by job id, a dozen per job, cost more than the
    placement itself (memory-bound, cache-cold). Positions order as the ids do, so
    every tie is broken as by id.
    """
    previous = previous if previous is not None else {}
    jobs = sorted(allocations)
    cfgs = [allocations[j] for j in jobs]
    prevs = [previous.get(j) for j in jobs]
    valid = cluster.config_index
    demand = dict.fromkeys(cluster.gpu_types, 0)
    by_type: dict[str, list[int]] = {t: [] for t in cluster.gpu_types}
    for k, cfg in enumerate(cfgs):
        if cfg not in valid:
            raise PlacementError(
                f"allocations[{jobs[k]!r}]: {cfg} is not in the cluster's configuration set"
            )
        demand[cfg.gpu_type] += cfg.num_gpus
        by_type[cfg.gpu_type].append(k)
    for t, d in demand.items():
        if d > cluster.capacity[t]:
            raise PlacementError(
                f"allocations: {d} GPUs of {t!r} requested, capacity is {cluster.capacity[t]}"
            )

    kept, kept_gpus = _kept(cluster, cfgs, prevs)
    pin = frozenset(k for k, j in enumerate(jobs) if j in pinned) if pinned else frozenset()
    placed: list[tuple[GpuId, ...]] = [()] * len(jobs)
    evicted: set[int] = set()
    for t, type_jobs in by_type.items():
        if type_jobs:
            _place_type(cluster, t, type_jobs, cfgs, prevs, kept, kept_gpus, placed, evicted,
                        pin)

    moved = frozenset(
        jobs[k] for k, vns in enumerate(kept)
        if (vns is None or k in evicted)
        and ((prev := prevs[k]) is None or placed[k] != _sorted_tuple(prev))
    )
    return PlacementResult(dict(zip(jobs, placed, strict=True)), moved,
                           frozenset(jobs[k] for k in evicted) & moved)


def _sorted_tuple(gpus: Sequence[GpuId]) -> tuple[GpuId, ...]:
    # Most jobs hold one GPU; skip sorting (GpuId comparisons are slow) where we can.
    return tuple(gpus) if len(gpus) < 2 else tuple(sorted(gpus))


def _kept(
    cluster: Cluster,
    cfgs: list[Config],
    prevs: list[Sequence[GpuId] | None],
) -> tuple[list[tuple[int, ...] | None], list[tuple[GpuId, ...] | None]]:
    """Per job (position): its vnodes if its previous GPUs are a valid placement of
    its new config, else None; and those GPUs sorted (its placement if it stays).

    Malformed or overlapping `previous` entries are not trusted: on a GPU claimed by
    two jobs, the first job by id keeps it and the other is placed afresh.
    """
    info = cluster.gpu_numbering
    claimed: set[int] = set()
    kept: list[tuple[int, ...] | None] = [None] * len(cfgs)
    kept_gpus: list[tuple[GpuId, ...] | None] = [None] * len(cfgs)
    for k, prev in enumerate(prevs):
        if not prev:
            continue
        gpu_type, num_nodes, num_gpus = cfgs[k]
        if len(prev) != num_gpus:
            continue
        if num_gpus == 1:  # most jobs: no sets to build
            node, g = prev[0]
            i = info.get(node)
            if i is None or i[0] != gpu_type or not 0 <= g < i[3] or (i[4] + g) in claimed:
                continue
            claimed.add(i[4] + g)
            kept[k] = (i[1] + g // i[2],)
            kept_gpus[k] = _sorted_tuple(prev)
            continue
        vns: set[int] = set()
        ids: set[int] = set()
        for node, g in prev:
            i = info.get(node)
            if i is None or i[0] != gpu_type or not 0 <= g < i[3]:
                break
            vns.add(i[1] + g // i[2])
            ids.add(i[4] + g)
        else:
            # num_gpus distinct GPUs over exactly num_nodes vnodes: for whole-node
            # configs that means each vnode is fully covered.
            if len(ids) == len(prev) and len(vns) == num_nodes and claimed.isdisjoint(ids):
                claimed |= ids
                kept[k] = tuple(sorted(vns))
                kept_gpus[k] = _sorted_tuple(prev)
    return kept, kept_gpus


def _place_type(
    cluster: Cluster,
    t: str,
    jobs: list[int],
    cfgs: list[Config],
    prevs: list[Sequence[GpuId] | None],
    kept: list[tuple[int, ...] | None],
    kept_gpus: list[tuple[GpuId, ...] | None],
    placed: list[tuple[GpuId, ...]],
    evicted: set[int],
    pinned: frozenset[int] = frozenset(),
) -> None:
    """Place type `t`'s jobs (positions, ascending) into `placed`."""
    r = cluster.gpus_per_vnode[t]
    vnodes = cluster.vnodes[t]
    whole, partial, kept_whole, kept_part = _by_shape(r, jobs, cfgs, kept)
    fit = _fit(r, len(vnodes), whole, partial, kept_whole, kept_part, pinned)
    if fit is None:  # unreachable by the argument in the module doc; kept as a safety net
        # Last resort: repack the whole type from scratch, which always fits.
        fit = _fit(r, len(vnodes), whole + [(k, len(v)) for k, v in kept_whole.items()],
                   partial + [(k, g) for k, (_, g) in kept_part.items()], {}, {})
        assert fit is not None, "from-scratch packing failed with per-type totals in capacity"
        fit = (fit[0], [*kept_whole, *kept_part])
    vnode_of, type_evicted = fit
    evicted.update(type_evicted)
    gone = set(type_evicted)
    incoming = _place_spanning(r, vnodes, cfgs, placed, vnode_of,
                               (*(k for k, _ in whole), *(k for k, _ in partial),
                                *type_evicted))
    # (a kept job's kept_gpus and prevs are set: it keeps what it had)
    for k in kept_whole:
        if k not in gone:
            gpus = kept_gpus[k]
            assert gpus is not None
            placed[k] = gpus
    used: dict[int, set[int]] = {}  # vnode -> local GPU indices held by kept partial jobs
    for k, (v, _) in kept_part.items():
        if k not in gone:
            gpus, prev = kept_gpus[k], prevs[k]
            assert gpus is not None and prev is not None
            placed[k] = gpus
            if v in incoming:
                off = vnodes[v].offset
                used.setdefault(v, set()).update(g.index - off for g in prev)
    for v, movers in incoming.items():
        _place_partial(r, vnodes[v], v, movers, cfgs, prevs, kept_part, kept_gpus, placed,
                       used.get(v, set()))


def _by_shape(r: int, jobs: list[int], cfgs: list[Config], kept: list[tuple[int, ...] | None],
              ) -> tuple[list[tuple[int, int]], list[tuple[int, int]],
                         dict[int, tuple[int, ...]], dict[int, tuple[int, int]]]:
    """One type's jobs by shape (`r` GPUs a vnode): (whole-vnode jobs to place, with
    their vnode count; partial ones, with their GPUs; whole ones kept, with their
    vnodes; partial ones kept, with their vnode and GPUs)."""
    whole: list[tuple[int, int]] = []
    partial: list[tuple[int, int]] = []
    kept_whole: dict[int, tuple[int, ...]] = {}
    kept_part: dict[int, tuple[int, int]] = {}
    for k in jobs:
        g = cfgs[k].num_gpus
        vns = kept[k]
        if g >= r:
            if vns is None:
                whole.append((k, g // r))
            else:
                kept_whole[k] = vns
        elif vns is None:
            partial.append((k, g))
        else:
            kept_part[k] = (vns[0], g)
    return whole, partial, kept_whole, kept_part


def _place_spanning(r: int, vnodes: Sequence[VirtualNode], cfgs: list[Config],
                    placed: list[tuple[GpuId, ...]], vnode_of: Mapping[int, tuple[int, ...]],
                    movers: Iterable[int]) -> dict[int, list[int]]:
    """Place each of `movers` that fills its vnodes (its GPUs: theirs, in physical
    order); returns the others, partial jobs placed afresh, by vnode."""
    incoming: dict[int, list[int]] = {}  # vnode -> partial jobs placed there afresh
    rank: dict[int, int] | None = None
    for k in movers:
        vns = vnode_of[k]
        if len(vns) > 1 or cfgs[k].num_gpus == r:
            if rank is None:  # sorting vnodes, not GpuIds; `Cluster(...)` need not be sorted
                order = sorted(range(len(vnodes)),
                               key=lambda v: (vnodes[v].physical, vnodes[v].offset))
                rank = {v: n for n, v in enumerate(order)}
            placed[k] = tuple(g for v in sorted(vns, key=rank.__getitem__)
                              for g in vnodes[v].gpus())
        else:
            incoming.setdefault(vns[0], []).append(k)
    return incoming


def _place_partial(r: int, vn: VirtualNode, v: int, movers: list[int], cfgs: list[Config],
                   prevs: list[Sequence[GpuId] | None],
                   kept_part: Mapping[int, tuple[int, int]],
                   kept_gpus: list[tuple[GpuId, ...] | None],
                   placed: list[tuple[GpuId, ...]], taken: set[int]) -> None:
    """Place the partial jobs `movers` on vnode `v` (`vn`), around the GPUs kept
    jobs hold there (`taken`): largest first, onto the lowest free GPUs."""
    movers.sort(key=lambda k: (-cfgs[k].num_gpus, k))
    rest = []
    for k in movers:
        # An evicted job that landed back on its own vnode gets its old GPUs if
        # they are still free, which undoes the eviction.
        own = None
        if k in kept_part and kept_part[k][0] == v:
            prev = prevs[k]
            assert prev is not None
            own = {g.index - vn.offset for g in prev}
        if own is not None and taken.isdisjoint(own):
            gpus = kept_gpus[k]
            assert gpus is not None
            taken = taken | own
            placed[k] = gpus
        else:
            rest.append(k)
    free = iter([n for n in range(r) if n not in taken])
    for k in rest:
        placed[k] = tuple(GpuId(vn.physical, vn.offset + next(free))
                          for _ in range(cfgs[k].num_gpus))


def _fit(
    r: int,
    n: int,
    whole: list[tuple[int, int]],
    partial: list[tuple[int, int]],
    kept_whole: Mapping[int, tuple[int, ...]],
    kept_part: Mapping[int, tuple[int, int]],
    pinned: frozenset[int] = frozenset(),
) -> tuple[dict[int, tuple[int, ...]], list[int]] | None:
    """Assign jobs of one type to its `n` vnodes of `r` GPUs.

    `whole` holds (job, vnodes needed), `partial` (job, GPUs), both to be placed;
    `kept_*` are pinned where they are unless evicted. Returns job -> vnodes and the
    evicted jobs, or None if no assignment was found.
    """
    packing = _Packing(r, n, partial, kept_whole, kept_part)
    if not packing.place_whole(whole, pinned) or not packing.place_partial(pinned):
        return None
    return packing.out, packing.evicted


class _Packing:
    """`_fit`'s state: one type's vnodes as the kept jobs leave them, then as the
    jobs to place (whole-node ones first, then partial ones) fill them."""

    def __init__(self, r: int, n: int, partial: list[tuple[int, int]],
                 kept_whole: Mapping[int, tuple[int, ...]],
                 kept_part: Mapping[int, tuple[int, int]]) -> None:
        self.r, self.n = r, n
        self.free = [r] * n
        self.owned = [False] * n  # held by a whole-node job; never shared
        # The kept partial jobs on each vnode, as (GPUs, job).
        self.residents: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.out: dict[int, tuple[int, ...]] = {}
        self.evicted: list[int] = []
        self.pending = [(-g, job) for job, g in partial]  # min-heap: largest first, then by id
        free, owned, residents, out = self.free, self.owned, self.residents, self.out
        for job, vns in kept_whole.items():
            for v in vns:
                owned[v] = True
                free[v] = 0
            out[job] = vns
        for job, (v, g) in kept_part.items():
            free[v] -= g
            residents[v].append((g, job))
            out[job] = (v,)

    def evict(self, v: int, victims: list[tuple[int, int]]) -> None:
        residents, free, out = self.residents, self.free, self.out
        for g, job in victims:
            residents[v].remove((g, job))
            free[v] += g
            del out[job]
            self.evicted.append(job)
            heapq.heappush(self.pending, (-g, job))

    def place_whole(self, whole: list[tuple[int, int]], pinned: frozenset[int]) -> bool:
        """Whole-node jobs need empty vnodes. If too few are empty, clear those cheapest
        to clear (fewest kept jobs, then fewest GPUs); their jobs join the partial
        queue. False: too few vnodes even so."""
        r, n, free, owned, residents = self.r, self.n, self.free, self.owned, self.residents
        empty = [v for v in range(n) if free[v] == r]
        need = sum(m for _, m in whole)
        if need > len(empty):
            busy = [v for v in range(n) if not owned[v] and free[v] < r]
            def clearing(v: int) -> tuple[int, int, int, int]:
                return (sum(j in pinned for _, j in residents[v]), len(residents[v]),
                        r - free[v], v)

            for v in heapq.nsmallest(need - len(empty), busy, key=clearing):
                self.evict(v, sorted(residents[v]))
                empty.append(v)
            if need > len(empty):
                return False
            empty.sort()
        nxt = 0
        for job, m in sorted(whole, key=lambda x: (-x[1], x[0])):
            vns = tuple(empty[nxt:nxt + m])
            nxt += m
            for v in vns:
                owned[v] = True
                free[v] = 0
            self.out[job] = vns
        return True

    def place_partial(self, pinned: frozenset[int]) -> bool:
        """Partial jobs, largest first, best fit: the most-occupied vnode that fits, so
        empty vnodes stay empty for later whole-node jobs; where none fits, the vnode
        cheapest to make room on (`_room_cost`). False: no room anywhere."""
        r, n, free, owned, residents = self.r, self.n, self.free, self.owned, self.residents
        pending, out = self.pending, self.out
        # buckets[f] is a lazy heap of vnodes with f free GPUs; an entry is stale once
        # free[v] != f.
        buckets: list[list[int]] = [[] for _ in range(r + 1)]
        for v in range(n):
            if not owned[v] and free[v]:
                buckets[free[v]].append(v)  # ascending, hence already a heap
        for res in residents:
            res.sort(key=lambda x: (-x[0], x[1]))  # largest first: fewest evictions
        # Lazy heap of eviction costs for size room_g. Costs only rise as vnodes fill,
        # so a popped entry whose cost is still current is the cheapest.
        room: list[tuple[int, int, int, int]] = []
        room_g = 0
        heapq.heapify(pending)
        while pending:
            neg, job = heapq.heappop(pending)
            g = -neg
            fit = _best_fit(buckets, free, g, r)
            if fit is None:
                if room_g != g:
                    room_g = g
                    room = [c for u in range(n)
                            if (c := _room_cost(u, g, owned, free, residents, pinned))]
                    heapq.heapify(room)
                while room:
                    cost = heapq.heappop(room)
                    now = _room_cost(cost[-1], g, owned, free, residents, pinned)
                    if now == cost:
                        fit = cost[-1]
                        break
                    if now is not None:
                        heapq.heappush(room, now)
                if fit is None:
                    return False
                self.evict(fit, _victims(residents[fit], g - free[fit], g, pinned))
                free[fit] -= g
                if c := _room_cost(fit, g, owned, free, residents, pinned):  # popped: re-enter
                    heapq.heappush(room, c)
            else:
                free[fit] -= g
            out[job] = (fit,)
            if free[fit]:
                heapq.heappush(buckets[free[fit]], fit)
        return True


def _best_fit(buckets: list[list[int]], free: list[int], g: int, r: int) -> int | None:
    for f in range(g, r + 1):
        b = buckets[f]
        while b and free[b[0]] != f:
            heapq.heappop(b)
        if b:
            return b[0]  # left in place: it goes stale once the job lands
    return None


def _victims(residents: list[tuple[int, int]], short: int, g: int,
             pinned: frozenset[int] = frozenset()) -> list[tuple[int, int]]:
    """The fewest kept jobs smaller than `g` freeing `short` GPUs, and of those the fewest
    GPUs, so the evicted jobs are easy to re-place; jobs not `pinned`, where they can.
    `residents` is sorted largest first.

    Only smaller jobs are evicted, so they are placed after this one and nothing is
    evicted twice. Some vnode always qualifies while any vnode has a free GPU: the
    jobs of size >= g there are multiples of g, so removing the rest leaves >= g free.
    """
    if pinned:
        free_to_go = [x for x in residents if x[1] not in pinned]
        if sum(s for s, _ in free_to_go if s < g) >= short:
            residents = free_to_go
    cand = [x for x in residents if x[0] < g]
    k = got = 0
    while got < short and k < len(cand):  # fewest jobs: take the largest
        got += cand[k][0]
        k += 1
    if got < short:
        return []
    # Same count, fewest GPUs: fill each slot with the smallest job that still lets the
    # remaining slots, taken largest-first, cover the shortage.
    victims = []
    for slots in range(k, 0, -1):
        for i in range(len(cand) - 1, -1, -1):
            rest = cand[:i] + cand[i + 1:]
            if cand[i][0] + sum(s for s, _ in rest[:slots - 1]) >= short:
                victims.append(cand[i])
                short -= cand[i][0]
                cand = rest
                break
    return victims


def _room_cost(
    v: int, g: int, owned: list[bool], free: list[int], residents: list[list[tuple[int, int]]],
    pinned: frozenset[int] = frozenset(),
) -> tuple[int, int, int, int] | None:
    """(pinned evictions, evictions, GPUs evicted, v) to make room for `g` GPUs on vnode
    v; None if impossible."""
    if owned[v] or not residents[v]:
        return None
    victims = _victims(residents[v], g - free[v], g, pinned)
    return ((sum(j in pinned for _, j in victims), len(victims), sum(s for s, _ in victims), v)
            if victims else None)
