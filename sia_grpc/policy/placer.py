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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sia_grpc.policy.cluster import Cluster, Config, GpuId

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
    """
    previous = previous if previous is not None else {}
    jobs = sorted(allocations)
    valid = cluster.config_index
    demand = dict.fromkeys(cluster.gpu_types, 0)
    by_type: dict[str, list[str]] = {t: [] for t in cluster.gpu_types}
    for job in jobs:
        cfg = allocations[job]
        if cfg not in valid:
            raise PlacementError(
                f"allocations[{job!r}]: {cfg} is not in the cluster's configuration set"
            )
        demand[cfg.gpu_type] += cfg.num_gpus
        by_type[cfg.gpu_type].append(job)
    for t, d in demand.items():
        if d > cluster.capacity[t]:
            raise PlacementError(
                f"allocations: {d} GPUs of {t!r} requested, capacity is {cluster.capacity[t]}"
            )

    kept = _kept(cluster, allocations, previous, jobs)
    placements: dict[str, tuple[GpuId, ...]] = {}
    evicted: set[str] = set()
    for t, type_jobs in by_type.items():
        if type_jobs:
            _place_type(cluster, t, type_jobs, allocations, previous, kept, placements, evicted,
                        pinned)

    placements = {j: placements[j] for j in jobs}
    moved = set()
    for job in jobs:
        prev = previous.get(job)
        if (job not in kept or job in evicted) and (
            prev is None or placements[job] != _sorted_tuple(prev)
        ):
            moved.add(job)
    return PlacementResult(placements, frozenset(moved), frozenset(evicted & moved))


def _sorted_tuple(gpus: Sequence[GpuId]) -> tuple[GpuId, ...]:
    # Most jobs hold one GPU; skip sorting (GpuId comparisons are slow) where we can.
    return tuple(gpus) if len(gpus) < 2 else tuple(sorted(gpus))


def _kept(
    cluster: Cluster,
    allocations: Mapping[str, Config],
    previous: Mapping[str, Sequence[GpuId]],
    jobs: list[str],
) -> dict[str, tuple[int, ...]]:
    """Jobs whose previous GPUs are a valid placement of their new config -> their vnodes.

    Malformed or overlapping `previous` entries are not trusted: on a GPU claimed by
    two jobs, the first job by id keeps it and the other is placed afresh.
    """
    info = cluster.gpu_numbering
    claimed: set[int] = set()
    kept: dict[str, tuple[int, ...]] = {}
    for job in jobs:
        prev = previous.get(job)
        if not prev:
            continue
        gpu_type, num_nodes, num_gpus = allocations[job]
        if len(prev) != num_gpus:
            continue
        if num_gpus == 1:  # most jobs: no sets to build
            node, k = prev[0]
            i = info.get(node)
            if i is None or i[0] != gpu_type or not 0 <= k < i[3] or (i[4] + k) in claimed:
                continue
            claimed.add(i[4] + k)
            kept[job] = (i[1] + k // i[2],)
            continue
        vns: set[int] = set()
        ids: set[int] = set()
        for node, k in prev:
            i = info.get(node)
            if i is None or i[0] != gpu_type or not 0 <= k < i[3]:
                break
            vns.add(i[1] + k // i[2])
            ids.add(i[4] + k)
        else:
            # num_gpus distinct GPUs over exactly num_nodes vnodes: for whole-node
            # configs that means each vnode is fully covered.
            if len(ids) == len(prev) and len(vns) == num_nodes and claimed.isdisjoint(ids):
                claimed |= ids
                kept[job] = tuple(sorted(vns))
    return kept


def _place_type(
    cluster: Cluster,
    t: str,
    jobs: list[str],
    allocations: Mapping[str, Config],
    previous: Mapping[str, Sequence[GpuId]],
    kept: Mapping[str, tuple[int, ...]],
    placements: dict[str, tuple[GpuId, ...]],
    evicted: set[str],
    pinned: frozenset[str] = frozenset(),
) -> None:
    r = cluster.gpus_per_vnode[t]
    vnodes = cluster.vnodes[t]
    whole: list[tuple[str, int]] = []
    partial: list[tuple[str, int]] = []
    kept_whole: dict[str, tuple[int, ...]] = {}
    kept_part: dict[str, tuple[int, int]] = {}
    for job in jobs:
        g = allocations[job].num_gpus
        vns = kept.get(job)
        if g >= r:
            if vns is None:
                whole.append((job, g // r))
            else:
                kept_whole[job] = vns
        elif vns is None:
            partial.append((job, g))
        else:
            kept_part[job] = (vns[0], g)

    fit = _fit(r, len(vnodes), whole, partial, kept_whole, kept_part, pinned)
    if fit is None:  # unreachable by the argument in the module doc; kept as a safety net
        # Last resort: repack the whole type from scratch, which always fits.
        fit = _fit(r, len(vnodes), whole + [(j, len(v)) for j, v in kept_whole.items()],
                   partial + [(j, g) for j, (_, g) in kept_part.items()], {}, {})
        assert fit is not None, "from-scratch packing failed with per-type totals in capacity"
        fit = (fit[0], [*kept_whole, *kept_part])
    vnode_of, type_evicted = fit
    evicted.update(type_evicted)
    gone = set(type_evicted)
    still_kept = {j for j in jobs if j in kept and j not in gone}

    incoming: dict[int, list[str]] = {}  # vnode -> partial jobs placed there afresh
    rank: dict[int, int] | None = None
    for job, vns in vnode_of.items():
        if job in still_kept:
            continue
        if len(vns) > 1 or allocations[job].num_gpus == r:
            if rank is None:  # sorting vnodes, not GpuIds; `Cluster(...)` need not be sorted
                order = sorted(range(len(vnodes)),
                               key=lambda v: (vnodes[v].physical, vnodes[v].offset))
                rank = {v: k for k, v in enumerate(order)}
            placements[job] = tuple(g for v in sorted(vns, key=rank.__getitem__)
                                    for g in vnodes[v].gpus())
        else:
            incoming.setdefault(vns[0], []).append(job)

    used: dict[int, set[int]] = {}  # vnode -> local GPU indices held by kept partial jobs
    for job in jobs:
        if job in still_kept:
            prev = previous[job]
            placements[job] = _sorted_tuple(prev)
            v = vnode_of[job][0]
            if v in incoming and job in kept_part:
                off = vnodes[v].offset
                used.setdefault(v, set()).update(g.index - off for g in prev)

    for v, movers in incoming.items():
        vn = vnodes[v]
        taken = used.get(v, set())
        movers.sort(key=lambda j: (-allocations[j].num_gpus, j))
        rest = []
        for job in movers:
            # An evicted job that landed back on its own vnode gets its old GPUs if
            # they are still free, which undoes the eviction.
            own = None
            if job in kept_part and kept_part[job][0] == v:
                own = {g.index - vn.offset for g in previous[job]}
            if own is not None and taken.isdisjoint(own):
                taken = taken | own
                placements[job] = _sorted_tuple(previous[job])
            else:
                rest.append(job)
        free = iter([k for k in range(r) if k not in taken])
        for job in rest:
            placements[job] = tuple(GpuId(vn.physical, vn.offset + next(free))
                                    for _ in range(allocations[job].num_gpus))


def _fit(
    r: int,
    n: int,
    whole: list[tuple[str, int]],
    partial: list[tuple[str, int]],
    kept_whole: Mapping[str, tuple[int, ...]],
    kept_part: Mapping[str, tuple[int, int]],
    pinned: frozenset[str] = frozenset(),
) -> tuple[dict[str, tuple[int, ...]], list[str]] | None:
    """Assign jobs of one type to its `n` vnodes of `r` GPUs.

    `whole` holds (job, vnodes needed), `partial` (job, GPUs), both to be placed;
    `kept_*` are pinned where they are unless evicted. Returns job -> vnodes and the
    evicted jobs, or None if no assignment was found.
    """
    free = [r] * n
    owned = [False] * n  # held by a whole-node job; never shared
    residents: list[list[tuple[int, str]]] = [[] for _ in range(n)]  # kept partial jobs
    out: dict[str, tuple[int, ...]] = {}
    evicted: list[str] = []
    pending = [(-g, job) for job, g in partial]  # min-heap: largest first, then by id

    for job, vns in kept_whole.items():
        for v in vns:
            owned[v] = True
            free[v] = 0
        out[job] = vns
    for job, (v, g) in kept_part.items():
        free[v] -= g
        residents[v].append((g, job))
        out[job] = (v,)

    def evict(v: int, victims: list[tuple[int, str]]) -> None:
        for g, job in victims:
            residents[v].remove((g, job))
            free[v] += g
            del out[job]
            evicted.append(job)
            heapq.heappush(pending, (-g, job))

    # Whole-node jobs need empty vnodes. If too few are empty, clear those cheapest to
    # clear (fewest kept jobs, then fewest GPUs); their jobs join the partial queue.
    empty = [v for v in range(n) if free[v] == r]
    need = sum(m for _, m in whole)
    if need > len(empty):
        busy = [v for v in range(n) if not owned[v] and free[v] < r]
        def clearing(v: int) -> tuple[int, int, int, int]:
            return (sum(j in pinned for _, j in residents[v]), len(residents[v]),
                    r - free[v], v)

        for v in heapq.nsmallest(need - len(empty), busy, key=clearing):
            evict(v, sorted(residents[v]))
            empty.append(v)
        if need > len(empty):
            return None
        empty.sort()
    nxt = 0
    for job, m in sorted(whole, key=lambda x: (-x[1], x[0])):
        vns = tuple(empty[nxt:nxt + m])
        nxt += m
        for v in vns:
            owned[v] = True
            free[v] = 0
        out[job] = vns

    # Partial jobs, largest first, best fit: the most-occupied vnode that fits, so
    # empty vnodes stay empty for later whole-node jobs. buckets[f] is a lazy heap
    # of vnodes with f free GPUs; an entry is stale once free[v] != f.
    buckets: list[list[int]] = [[] for _ in range(r + 1)]
    for v in range(n):
        if not owned[v] and free[v]:
            buckets[free[v]].append(v)  # ascending, hence already a heap
    for res in residents:
        res.sort(key=lambda x: (-x[0], x[1]))  # largest first: fewest evictions
    # Lazy heap of eviction costs for size room_g. Costs only rise as vnodes fill,
    # so a popped entry whose cost is still current is the cheapest.
    room: list[tuple[int, int, int]] = []
    room_g = 0
    heapq.heapify(pending)
    while pending:
        neg, job = heapq.heappop(pending)
        g = -neg
        v = _best_fit(buckets, free, g, r)
        if v is None:
            if room_g != g:
                room_g = g
                room = [c for u in range(n)
                        if (c := _room_cost(u, g, owned, free, residents, pinned))]
                heapq.heapify(room)
            while room:
                cost = heapq.heappop(room)
                now = _room_cost(cost[-1], g, owned, free, residents, pinned)
                if now == cost:
                    v = cost[-1]
                    break
                if now is not None:
                    heapq.heappush(room, now)
            if v is None:
                return None
            evict(v, _victims(residents[v], g - free[v], g, pinned))
            free[v] -= g
            if c := _room_cost(v, g, owned, free, residents, pinned):  # v was popped: re-enter it
                heapq.heappush(room, c)
        else:
            free[v] -= g
        out[job] = (v,)
        if free[v]:
            heapq.heappush(buckets[free[v]], v)
    return out, evicted


def _best_fit(buckets: list[list[int]], free: list[int], g: int, r: int) -> int | None:
    for f in range(g, r + 1):
        b = buckets[f]
        while b and free[b[0]] != f:
            heapq.heappop(b)
        if b:
            return b[0]  # left in place: it goes stale once the job lands
    return None


def _victims(residents: list[tuple[int, str]], short: int, g: int,
             pinned: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
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
    v: int, g: int, owned: list[bool], free: list[int], residents: list[list[tuple[int, str]]],
    pinned: frozenset[str] = frozenset(),
) -> tuple[int, int, int, int] | None:
    """(pinned evictions, evictions, GPUs evicted, v) to make room for `g` GPUs on vnode
    v; None if impossible."""
    if owned[v] or not residents[v]:
        return None
    victims = _victims(residents[v], g - free[v], g, pinned)
    return ((sum(j in pinned for _, j in victims), len(victims), sum(s for s, _ in victims), v)
            if victims else None)
