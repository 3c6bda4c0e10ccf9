"""`sia bench failover`: a controller pair on PostgreSQL, its leader SIGKILLed again
and again under load.

Two `sia-controller` processes share one PostgreSQL store (a throwaway server, or
`store`); modeled node agents (tasks in this process, both addresses given) hold a
few hundred GPUs; clients (both addresses) send a steady stream of `CreateJob`, and
rounds run every second. The leader is SIGKILLed `kills` times; each time the
survivor takes over and the killed one is restarted, as a standby. Per kill:

- `failover_s`: from the SIGKILL to the first `CreateJob` answered OK after the
  killed process is gone (so by the new leader), as the clients saw it (their own
  retries and backoff included);
- `failover_round_s`: from the SIGKILL to the end of the new leader's first round
  (one started after the kill, all its directives acknowledged).

Over the whole run:

- `jobs_lost`: jobs whose CreateJob returned OK that the leader does not have at the end;
- `double_allocations`: GPUs two jobs held at once, as the controller's books show
  them after each failover and at the end (RUNNING and RESTARTING jobs);
- `refused_double_bookings`: RUNs an agent refused because the GPU was busy with
  another job or a profiling pass: the controller gave out a GPU that was not free
  (the agent's check kept it from being used twice);
- `needless_restarts`: workers running at a kill that the new leader stopped (a STOP,
  or a RUN of a newer generation on that node) other than by one of its rounds,
  i.e. while taking over and reconciling. Workers its first round moved are
  counted apart (`moved_by_first_round`): those are the policy's decisions.

The jobs are rigid 1-GPU jobs pinned to one GPU type (half rtx, half dgx-ext), so a
round has no reason of its own to move a running one: what moves them is the
failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.nodeagent import AgentConfig, AgentStatus, NodeAgent
from sia_grpc.testing.controllers import FAST_ROUNDS, ControllerNode, ControllerPair

_TYPES = ("rtx", "dgx-ext")
CALL_S = 30.0  # a client's deadline per call: a failover fits in it
WAIT_S = 60.0  # how long one step of a failover may take before the run fails
# A GPU is double-booked if an agent refuses a RUN with one of these.
_HELD = ("is held by job", "is profiling job")


class BenchError(Exception):
    """The run could not go on (a failover did not complete in time)."""


async def until(predicate: Callable[[], Awaitable], what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.02)


def _spec(k: int) -> pb.JobSpec:
    gpu_type = _TYPES[k % len(_TYPES)]
    return pb.JobSpec(name=f"c10-{k}", application="cifar10",
                      adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=1, batch_size=128,
                      allowed_gpu_types=[gpu_type])


@dataclass
class Stream:
    """`clients` concurrent clients creating jobs at `rate` per second in all."""

    target: str
    clients: int
    rate: float
    accepted: list[tuple[float, str]] = field(default_factory=list)  # (answered, job id)
    errors: list[str] = field(default_factory=list)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def first_after(self, t: float) -> float | None:
        """When the first create after monotonic time `t` was answered OK, if yet."""
        return min((at for at, _ in self.accepted if at > t), default=None)

    async def _client(self, i: int) -> None:
        every = self.clients / self.rate
        async with AsyncSiaClient(self.target, timeout=CALL_S) as sia:
            k = i
            while True:
                started = time.monotonic()
                try:
                    job = await sia.submit(_spec(k), request_id=uuid.uuid4().hex)
                except Exception as exc:  # (counted; the stream goes on)
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                else:
                    self.accepted.append((time.monotonic(), job.job_id))
                k += self.clients
                await asyncio.sleep(max(0.0, started + every - time.monotonic()))


@dataclass
class Bench:
    dsn: str
    agents: int
    gpus_per_agent: int
    ttl: float
    pair: ControllerPair = field(init=False)
    nodes: list[NodeAgent] = field(default_factory=list)
    kills: list[dict] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # double bookings seen
    crashes: list[str] = field(default_factory=list)  # controllers that exited unasked

    def __post_init__(self) -> None:
        self.pair = ControllerPair.on_free_ports(ttl=self.ttl, env=FAST_ROUNDS)
        self.logs = tempfile.mkdtemp(prefix="sia-bench-failover-")
        for name, n in zip("ab", self.pair.nodes, strict=True):
            n.log = os.path.join(self.logs, f"controller-{name}.log")

    async def start(self) -> None:
        for n in self.pair.nodes:
            await n.start(self.dsn)
        for i in range(self.agents):
            agent = NodeAgent(AgentConfig(
                node_id=f"n{i}", controller=self.pair.target, gpu_type=_TYPES[i % len(_TYPES)],
                num_gpus=self.gpus_per_agent, time_scale=1.0, telemetry_interval_s=2.0,
                backoff_base_s=0.05, backoff_cap_s=0.5, close_grace_s=0.5))
            await agent.start()
            self.nodes.append(agent)

    async def close(self) -> None:
        await asyncio.gather(*(a.close() for a in self.nodes), return_exceptions=True)
        await self.pair.stop()

    # -- what is observed -------------------------------------------------------------

    def workers(self) -> set[tuple[str, str, int]]:
        """(node, job, generation) of every worker the agents run now."""
        return {(a.config.node_id, r.job_id, r.generation)
                for a in self.nodes for r in a.backend.running()}

    async def settled(self, term: int) -> bool:
        """Every agent registered with the leader of `term`."""
        return all(a.status is AgentStatus.REGISTERED and a.term == term for a in self.nodes)

    @staticmethod
    async def first_round(sia: AsyncSiaClient, after_wall: float) -> pb.Round | None:
        """The first round that started after wall time `after_wall` and completed."""
        rounds: list[pb.Round] = await sia.rounds(limit=50)
        for r in rounds:
            if r.round and r.start_time.ToNanoseconds() / 1e9 > after_wall \
                    and r.HasField("end_time"):  # (a skipped round has no number)
                return r
        return None

    async def check_books(self, sia: AsyncSiaClient) -> None:
        """Note every GPU two RUNNING or RESTARTING jobs hold at once."""
        held: dict[tuple[str, int], str] = {}
        async for j in sia.list(page_size=1000, states=(pb.JOB_STATE_RUNNING,
                                                        pb.JOB_STATE_RESTARTING)):
            for g in j.status.allocation.gpus:
                other = held.setdefault((g.node, g.index), j.job_id)
                if other != j.job_id:
                    self.conflicts.append(f"{g.node}/{g.index}: {other} and {j.job_id}")

    def refused_as_held(self) -> list[str]:
        return [f"{a.config.node_id}: {d.job_id} g{d.generation}: {err}"
                for a in self.nodes for d, err in a.rejected if any(h in err for h in _HELD)]

    def stopped_by(self, term: int, before: set[tuple[str, str, int]],
                   first_round: int) -> tuple[list[str], list[str]]:
        """Of the workers in `before`, those the leader of `term` stopped: (outside its
        rounds, by its first round)."""
        by_node = {a.config.node_id: a for a in self.nodes}
        needless: list[str] = []
        moved: list[str] = []
        for node, job, gen in sorted(before):
            for t, d in by_node[node].received:
                if t != term or d.job_id != job or d.round > first_round:
                    continue
                if (d.action == pb.Directive.ACTION_STOP and d.generation >= gen) or (
                        d.action == pb.Directive.ACTION_RUN and d.generation > gen):
                    what = f"{node}: {job} g{gen} (round {d.round})"
                    (moved if d.round == first_round else needless).append(what)
                    break
        return needless, moved

    async def standby_up(self, node: ControllerNode) -> bool:
        """Whether `node` answers; one that exited on its own (not our SIGKILL) is
        counted in `crashes` and started again."""
        assert node.proc is not None  # (started)
        if node.proc.returncode is not None:
            self.crashes.append(f"{node.address}: exit status {node.proc.returncode}")
            await node.start(self.dsn)
        return await _answers(node)

    # -- one kill -------------------------------------------------------------------

    async def kill_once(self, sia: AsyncSiaClient, stream: Stream) -> dict:
        leader: ControllerNode = await until(self.pair.leader, "one leader")
        standby = self.pair.other(leader)
        term = max(a.term for a in self.nodes)
        await until(lambda: self.settled(term), "the agents on the leader")
        await until(lambda: self.standby_up(standby), f"the standby to answer (its log: "
                    f"{standby.log})")
        before = self.workers()
        killed_wall, killed = time.time(), time.monotonic()
        leader.kill()
        assert leader.proc is not None  # (it leads)
        await leader.proc.wait()
        gone = time.monotonic()
        await until(lambda: _true(stream.first_after(gone)), "a create on the new leader")
        created = stream.first_after(gone)
        assert created is not None  # (awaited above)
        new = await until(self.pair.leader, "the standby to lead")
        if new is leader:
            raise BenchError("the killed controller leads again")
        await leader.start(self.dsn)  # back, as a standby
        rnd = await until(lambda: self.first_round(sia, killed_wall),
                          "the new leader's first round")
        new_term = max(a.term for a in self.nodes)
        await until(lambda: self.settled(new_term), "the agents on the new leader")
        await self.check_books(sia)
        needless, moved = self.stopped_by(new_term, before, rnd.round)
        return {"term": new_term, "failover_s": created - killed,
                "failover_round_s": rnd.end_time.ToNanoseconds() / 1e9 - killed_wall,
                "first_round": rnd.round, "workers_at_kill": len(before),
                "needless_restarts": needless, "moved_by_first_round": moved}


async def _answers(node: ControllerNode) -> bool:
    return await node.health() is not None


async def _true(value) -> bool:
    return value is not None


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p95": None, "max": None}
    a = np.array(xs)
    return {"p50": float(np.median(a)), "p95": float(np.percentile(a, 95)),
            "max": float(a.max())}


async def failover(*, dsn: str, kills: int, agents: int = 32, gpus_per_agent: int = 8,
                   ttl: float = 4.0, rate: float = 20.0, clients: int = 4) -> dict:
    """The whole run (the module docstring); its results."""
    bench = Bench(dsn, agents, gpus_per_agent, ttl)
    stream = Stream(bench.pair.target, clients, rate)
    watcher = None
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(bench.close)
        await bench.start()
        sia = await stack.enter_async_context(AsyncSiaClient(bench.pair.target,
                                                             timeout=CALL_S))
        await until(bench.pair.leader, "one leader")
        watcher = asyncio.create_task(bench.pair.watch(every=0.05))
        stack.callback(watcher.cancel)
        stream.start()
        stack.push_async_callback(stream.stop)
        # Jobs profiled, placed and running before the first kill: a quarter of the GPUs.
        await asyncio.sleep(1.0)
        if not stream.accepted:
            raise BenchError(f"no create accepted: {stream.errors[-1:]}")
        await until(lambda: _true(len(bench.workers()) >= agents * gpus_per_agent // 4 or None),
                    "a quarter of the GPUs busy", timeout=180)
        t0 = time.monotonic()
        for _ in range(kills):
            bench.kills.append(await bench.kill_once(sia, stream))
        await stream.stop()
        await bench.check_books(sia)
        present = {j.job_id async for j in sia.list(page_size=1000)}
        elapsed = time.monotonic() - t0
    accepted = {job for _, job in stream.accepted}
    terms_ok = all(list(a.terms) == sorted(a.terms) for a in bench.nodes)
    held = bench.refused_as_held()
    needless = [w for k in bench.kills for w in k["needless_restarts"]]
    return {
        "kills": kills, "agents": agents, "gpus": agents * gpus_per_agent,
        "lease_ttl_s": ttl, "create_rate_per_s": rate, "clients": clients,
        "elapsed_s": elapsed,
        "failover_s": _stats([k["failover_s"] for k in bench.kills]),
        "failover_round_s": _stats([k["failover_round_s"] for k in bench.kills]),
        "jobs_accepted": len(accepted), "jobs_present": len(accepted & present),
        "jobs_lost": len(accepted - present),
        "double_allocations": len(bench.conflicts), "refused_double_bookings": len(held),
        "needless_restarts": len(needless),
        "moved_by_first_round": sum(len(k["moved_by_first_round"]) for k in bench.kills),
        "create_errors": len(stream.errors), "controller_crashes": bench.crashes,
        "logs": bench.logs,
        "terms_in_order": terms_ok,
        "stale_refused": sum(a.stale_refused for a in bench.nodes),
        "both_serving_samples": len(bench.pair.both_serving),
        "details": {"conflicts": bench.conflicts[:20], "refused_as_held": held[:20],
                    "needless": needless[:20], "errors": stream.errors[:10],
                    "lost": sorted(accepted - present)[:20]},
        "per_kill": [{k: v for k, v in kill.items()
                      if k not in ("needless_restarts", "moved_by_first_round")}
                     | {"needless_restarts": len(kill["needless_restarts"]),
                        "moved_by_first_round": len(kill["moved_by_first_round"])}
                     for kill in bench.kills],
    }


def passed(r: dict) -> bool:
    """The invariants (not the speed): nothing lost, nothing double-booked or
    needlessly restarted, terms in order, never two leaders, no controller crashed."""
    return (r["jobs_lost"] == 0 and r["double_allocations"] == 0
            and r["refused_double_bookings"] == 0 and r["needless_restarts"] == 0
            and r["terms_in_order"] and r["stale_refused"] == 0 and r["both_serving_samples"] == 0
            and not r["controller_crashes"])


def run(*, kills: int, agents: int, gpus_per_agent: int, ttl: float, rate: float,
        clients: int, store: str = "", json_out: str | None = None) -> int:
    from sia_grpc.controller.shell.server import loop_factory
    from sia_grpc.observability import configure_logging
    from sia_grpc.testing.postgres import PostgresServer

    configure_logging(level="error")  # the agents' reconnect warnings are expected here
    with contextlib.ExitStack() as stack:
        dsn = store or stack.enter_context(PostgresServer(durable=True)).database()
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            r = runner.run(failover(dsn=dsn, kills=kills, agents=agents,
                                    gpus_per_agent=gpus_per_agent, ttl=ttl, rate=rate,
                                    clients=clients))
    _report(r)  # first: a JSON path that cannot be written must not lose the run
    if json_out:
        with open(json_out, "w") as f:
            json.dump(r, f, indent=2)
    return 0 if passed(r) else 1


def _report(r: dict) -> None:
    f, fr = r["failover_s"], r["failover_round_s"]
    print(f"{r['kills']} SIGKILLs of the leader; {r['agents']} agents ({r['gpus']} GPUs), "
          f"{r['create_rate_per_s']:g} creates/s from {r['clients']} clients, lease "
          f"{r['lease_ttl_s']:g} s; {r['elapsed_s']:.0f} s")
    print(f"  kill → first CreateJob OK   p50 {f['p50']:.2f} s  p95 {f['p95']:.2f} s  "
          f"max {f['max']:.2f} s")
    print(f"  kill → first round done     p50 {fr['p50']:.2f} s  p95 {fr['p95']:.2f} s  "
          f"max {fr['max']:.2f} s")
    print(f"  jobs: {r['jobs_accepted']} accepted, {r['jobs_present']} present, "
          f"{r['jobs_lost']} lost; {r['create_errors']} creates failed")
    if r["controller_crashes"]:
        print(f"  controllers that exited on their own: {r['controller_crashes']} "
              f"(logs in {r['logs']})")
    print(f"  double allocations {r['double_allocations']} (RUNs refused by an agent as the "
          f"GPU was busy: {r['refused_double_bookings']}), needless restarts "
          f"{r['needless_restarts']} (moved by the new leader's first round: "
          f"{r['moved_by_first_round']}); terms in order at every agent: "
          f"{r['terms_in_order']}; both serving: {r['both_serving_samples']} samples")


__all__ = ["failover", "passed", "run"]
