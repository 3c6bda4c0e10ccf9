"""`sia bench control-plane`: the controller under load, over loopback.

Two measurements, reported side by side:

* **Round latency**: N modeled agents and M active jobs; rounds are triggered one
  at a time and timed from the tick to the last directive acknowledged (the
  round's effects in place), split into the solve (tick → result back from the
  solver process, estimation included) and the rest (dispatch: checkpoint-stops,
  RUNs, their acknowledgements, persistence).
* **CreateJob throughput**: C concurrent clients (in a separate process, as remote
  clients would be) submitting jobs to a controller with a file-backed store
  (`synchronous=FULL`); every accepted job is then counted in the store.

With `store` (a `postgresql://` DSN) both are measured again on that PostgreSQL
store, in the same run, and reported beside SQLite's.

The agents run in their own processes (one per GPU type, `sia-nodeagent --count`),
or with `agents_in_process` as tasks in the controller's process.

`sia bench load` (`load`): many agents and many submitted jobs at once — every
accepted job accounted for in the store, with the controller process's peak
memory and CPU time recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.machine import state as sm
from sia_grpc.controller.shell.server import loop_factory
from sia_grpc.controller.stores import SqliteStore as Store
from sia_grpc.controller.stores import describe, open_store
from sia_grpc.testing.localcluster import LocalCluster

_TYPES = ("rtx", "dgx-ext")  # both 8 GPUs per node in the artifact's profiles
_APPS = ("imagenet", "yolov3", "deepspeech2", "bert")  # long enough to stay active


def _spec(k: int) -> pb.JobSpec:
    app = _APPS[k % len(_APPS)]
    return pb.JobSpec(name=f"{app}-{k}", application=app, adaptivity=pb.ADAPTIVITY_ADAPTIVE)


async def round_latency(agents: int, gpus_per_agent: int, jobs: int, rounds: int,
                        in_process: bool = False, store: str = "") -> dict:
    """Rounds timed from tick to last ack. The agents run in one process per GPU
    type (so the controller's process is the controller alone), or with
    `in_process` as tasks in this one, sharing the controller's core. `store`: a
    PostgreSQL DSN (else an in-memory SQLite store)."""
    per_type = _per_type(agents, gpus_per_agent)
    rate = 50.0  # profiling passes take ~0.5 s of wall time; jobs last hours
    config = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", store=store,
                              round_duration=1e9, early_round_delay=1e9,
                              heartbeat_interval=100.0, heartbeat_timeout=3000.0,
                              store_synchronous="NORMAL")
    lc = LocalCluster(per_type, rate=rate, config=config, telemetry_interval=2.0)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(lc.close)
        await lc.start(agents=in_process)
        if not in_process:
            _spawn_agents(lc, per_type)
        client = await stack.enter_async_context(AsyncSiaClient(lc.target, timeout=120))
        await lc.wait_registered(agents, timeout=120)
        await _submit_and_profile(lc, client, jobs)
        timed = await _time_rounds(lc, rounds + 1)  # the first places everyone: reported apart
        assert lc.controller is not None
        return {"agents": agents, "gpus": sum(n * g for n, g in per_type.values()),
                "jobs": jobs, "rounds": rounds, "agents_in_process": in_process,
                **timed.summary(moved_last=int(lc.controller.rounds[-1].jobs_moved)),
                # (this process: the controller and the submitting client; the agents
                # and the solver run in their own)
                "controller_peak_rss_mib": _peak_rss_mib()}


def _per_type(agents: int, gpus_per_agent: int) -> dict[str, tuple[int, int]]:
    """(agents, GPUs each) per GPU type: `agents` spread over the types evenly."""
    return {t: (agents // len(_TYPES) + (i < agents % len(_TYPES)), gpus_per_agent)
            for i, t in enumerate(_TYPES)}


def _spawn_agents(lc: LocalCluster, per_type: dict[str, tuple[int, int]]) -> None:
    """One process per GPU type running all its agents (`sia-nodeagent --count`)."""
    for gpu_type, (count, per) in per_type.items():
        if count:
            lc.spawn_agent(gpu_type, gpu_type, per, count=count)


async def _submit_and_profile(lc: LocalCluster, client: AsyncSiaClient, jobs: int) -> None:
    """Submit `jobs` jobs, at most 64 at a time, and wait until every one is profiled."""
    limit = asyncio.Semaphore(64)  # like many users, not one burst of thousands

    async def submit(k: int) -> None:
        async with limit:
            await client.submit(_spec(k))
    await asyncio.gather(*(submit(k) for k in range(jobs)))
    c = lc.controller
    assert c is not None
    async with asyncio.timeout(600):  # every job profiled
        while c.state.jobs_by_state().get("PROFILING", 0):
            await asyncio.sleep(0.2)


@dataclass
class _RoundTimes:
    """What `_time_rounds` measured, one entry per round, the first included."""

    totals: list[float] = field(default_factory=list)  # tick to last ack, ms
    solves: list[float] = field(default_factory=list)  # tick to the solver's result, ms
    phases: list[tuple[float, float, float]] = field(default_factory=list)  # in the solve
    cpu: list[dict[str, float]] = field(default_factory=list)  # CPU s per process group
    moved: list[int] = field(default_factory=list)  # jobs the round moved

    def summary(self, *, moved_last: int) -> dict:
        """Percentiles over the rounds after the first (`moved_last`: the jobs the
        controller's last round moved)."""
        t, s = np.array(self.totals[1:]), np.array(self.solves[1:])
        rest = t - s
        cpu = self.cpu
        return {"first_round_ms": self.totals[0],
                "round_p50_ms": float(np.median(t)), "round_p95_ms": float(np.percentile(t, 95)),
                "solve_p50_ms": float(np.median(s)), "solve_p95_ms": float(np.percentile(s, 95)),
                "rest_p50_ms": float(np.median(rest)),
                "rest_p95_ms": float(np.percentile(rest, 95)),
                # the solver process's phases (medians): estimate, build + solve, place
                **dict(zip(("estimate_p50_ms", "ilp_p50_ms", "place_p50_ms"),
                           np.median(np.array(self.phases[1:]), axis=0).tolist(), strict=True)),
                "jobs_moved_last": moved_last,
                # Jobs each round moved, first included: how much a round has to do (the
                # jobs' modeled progress runs on the wall clock, so it varies run to run).
                "moved_per_round": self.moved,
                # CPU seconds each process group spent from tick to last ack (medians
                # over the timed rounds; `cpu_per_round_s`: every round, first included):
                # on a machine with fewer cores than busy processes the round waits for
                # CPU, whoever's it is. "agents" only for agents in their own processes.
                "cpu_p50_s": {k: float(np.median([r[k] for r in cpu[1:]])) for k in cpu[0]},
                "cpu_per_round_s": cpu}


async def _time_rounds(lc: LocalCluster, rounds: int) -> _RoundTimes:
    """`rounds` full rounds, one at a time, each timed from its tick to its last ack,
    with the CPU each process group spent meanwhile."""
    c = lc.controller
    assert c is not None
    out = _RoundTimes()
    agent_pids = [p.pid for p in lc.processes.values()]
    for _ in range(rounds):
        before = len(c.rounds)
        cpu0 = _cpu_by_process({"agents": agent_pids, "solver": solver_pids(c)})
        c.post(sm.Tick(c.clock.time(), "timer"))  # a full round, as the timer's
        async with asyncio.timeout(600):
            while len(c.rounds) == before:
                await asyncio.sleep(0.005)
        # (the solver's worker may have been replaced meanwhile: a new one counts
        # from 0)
        cpu1 = _cpu_by_process({"agents": agent_pids, "solver": solver_pids(c)})
        out.cpu.append({g: sum(t - cpu0.get(g, {}).get(pid, 0.0) for pid, t in by.items())
                        for g, by in cpu1.items()})
        rnd = c.rounds[-1]
        out.totals.append(rnd.total_ms)
        out.moved.append(int(rnd.jobs_moved))
        out.solves.append(rnd.total_ms - rnd.dispatch_ms)
        out.phases.append((rnd.estimate_ms, rnd.solve_ms, rnd.place_ms))
        await asyncio.sleep(1.0)  # telemetry flows between rounds, as in a 60 s round
    return out


def solver_pids(controller) -> list[int]:
    """The controller's solver worker processes (none before its first start)."""
    from sia_grpc.controller.shell.solver_pool import _workers

    pool = getattr(controller._pool, "_pool", None)
    return [] if pool is None else [p.pid for p in _workers(pool) if p.pid is not None]


def _cpu_by_process(groups: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    """CPU seconds (user + system) each process has used so far, by group:
    "controller" this process (the controller, and the bench's idle client), and each
    of `groups`' processes from /proc (Linux; without it only the controller). A
    process that has exited is left out."""
    out = {"controller": {os.getpid(): _cpu_s()}}
    if not os.path.exists("/proc/self/stat"):
        return out
    tick = os.sysconf("SC_CLK_TCK")
    for name, pids in groups.items():
        out[name] = {}
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[name][pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def _submit_load(target: str, creates: int, clients: int) -> tuple[int, float]:
    """(accepted, wall seconds) of `clients` concurrent SDK clients submitting
    `creates` jobs; runs in its own process, as remote clients would."""

    async def main() -> tuple[int, float]:
        per = -(-creates // clients)
        conns = [AsyncSiaClient(target, timeout=120) for _ in range(clients)]

        async def submit_many(client: AsyncSiaClient, start: int) -> int:
            for k in range(start, min(start + per, creates)):
                await client.submit(_spec(k))
            return max(min(start + per, creates) - start, 0)

        t0 = time.perf_counter()
        accepted = sum(await asyncio.gather(*(submit_many(c, i * per)
                                              for i, c in enumerate(conns))))
        wall = time.perf_counter() - t0
        for c in conns:
            await c.close()
        return accepted, wall

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main())


def _stored_jobs(target: str) -> int:
    with contextlib.closing(open_store(target)) as store:  # (JobStore: close, no __exit__)
        return len(store.all_jobs())


async def create_throughput(creates: int, clients: int, store: str = "") -> dict:
    """CreateJob/s on a new SQLite file, or on `store` (a PostgreSQL DSN: the jobs
    already in it are not counted as durable)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = store or str(Path(tmp) / "bench.db")
        before = _stored_jobs(db)
        config = ControllerConfig(listen="127.0.0.1:0", store=db, inline_solver=True)
        async with LocalCluster({}, config=config) as lc:
            loop = asyncio.get_running_loop()
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                # Warm-up, untimed: the client process's imports and both sides'
                # first calls (the jobs count towards the durability check).
                warm, _ = await loop.run_in_executor(pool, _submit_load, lc.target,
                                                     min(200, creates), clients)
                accepted, wall = await loop.run_in_executor(
                    pool, _submit_load, lc.target, creates, clients)
        # what survived, read back after the controller stopped
        durable = _stored_jobs(db) - before
    return {"store": describe(store) if store else "sqlite", "creates": creates,
            "clients": clients, "accepted": warm + accepted,
            "durable": durable, "create_per_s": accepted / wall, "wall_s": wall}


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def load(agents: int, gpus_per_agent: int, jobs: int, clients: int,
               rounds: int = 2) -> dict:
    """`agents` modeled agents in their own processes, `jobs` submitted by `clients`
    concurrent clients (another process), then `rounds` full rounds over all of
    them; every accepted job must be in the store after the controller stops."""
    per_type = _per_type(agents, gpus_per_agent)
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "load.db")
        config = ControllerConfig(listen="127.0.0.1:0", db_path=db, round_duration=1e9,
                                  early_round_delay=1e9, heartbeat_interval=100.0,
                                  heartbeat_timeout=3000.0, solve_timeout=600.0)
        lc = LocalCluster(per_type, rate=50.0, config=config, telemetry_interval=5.0)
        loop = asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(lc.close)
            await lc.start(agents=False)
            _spawn_agents(lc, per_type)
            await lc.wait_registered(agents, timeout=300)
            c = lc.controller
            assert c is not None
            cpu0, t0 = _cpu_s(), time.monotonic()
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                accepted, wall = await loop.run_in_executor(pool, _submit_load, lc.target,
                                                            jobs, clients)
            async with asyncio.timeout(900):  # taken up by the state machine, and profiled
                while len(c.state.jobs) < accepted or \
                        c.state.jobs_by_state().get("PROFILING", 0):
                    await asyncio.sleep(0.2)
            round_ms, round_parts = [], []
            for _ in range(rounds):
                before = len(c.rounds)
                c.post(sm.Tick(c.clock.time(), "timer"))
                async with asyncio.timeout(900):
                    while len(c.rounds) == before:
                        await asyncio.sleep(0.05)
                r = c.rounds[-1]
                round_ms.append(r.total_ms)
                round_parts.append({"jobs": r.jobs, "moved": r.jobs_moved,
                                    "estimate_ms": r.estimate_ms, "solve_ms": r.solve_ms,
                                    "place_ms": r.place_ms, "dispatch_ms": r.dispatch_ms,
                                    "note": r.note})
            states = c.state.jobs_by_state()
            cpu, elapsed = _cpu_s() - cpu0, time.monotonic() - t0
        with Store(db) as store:
            durable = len(store.all_jobs())
    return {"agents": agents, "gpus": sum(n * g for n, g in per_type.values()),
            "jobs": jobs, "accepted": accepted, "durable": durable,
            "create_per_s": accepted / wall, "states": states, "round_ms": round_ms,
            "rounds": round_parts, "controller_cpu_s": cpu, "elapsed_s": elapsed,
            "controller_peak_rss_mib": _peak_rss_mib()}


def run_load(*, agents: int, gpus_per_agent: int, jobs: int, clients: int,
             as_json: bool) -> int:
    from sia_grpc.observability import configure_logging

    configure_logging(level="warning")
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        r = runner.run(load(agents, gpus_per_agent, jobs, clients))
    if as_json:
        print(json.dumps(r, indent=2))
    else:
        print(f"{r['agents']} agents ({r['gpus']} GPUs, own processes), {r['jobs']} jobs from "
              f"{clients} clients: {r['accepted']} accepted ({r['create_per_s']:,.0f}/s), "
              f"{r['durable']} durable after shutdown")
        print(f"  jobs by state: {r['states']}")
        print("  full rounds over all of them (tick to last ack):")
        for ms, p in zip(r["round_ms"], r["rounds"], strict=True):
            print(f"    {ms:9,.0f} ms: {p['jobs']} jobs, {p['moved']} moved; estimate "
                  f"{p['estimate_ms']:,.0f}, solve {p['solve_ms']:,.0f}, place "
                  f"{p['place_ms']:,.0f}, dispatch {p['dispatch_ms']:,.0f} ms {p['note']}")
        print(f"  controller process: {r['controller_cpu_s']:.1f} CPU-s over {r['elapsed_s']:.1f} s"
              f", peak RSS {r['controller_peak_rss_mib']:.0f} MiB")
    return 0 if r["durable"] == r["accepted"] == r["jobs"] else 1


def run(*, agents: int, gpus_per_agent: int, jobs: int, rounds: int, creates: int,
        clients: int, as_json: bool, agents_in_process: bool = False, store: str = "") -> int:
    """Both measurements on SQLite, and with `store` (a PostgreSQL DSN) on it too:
    its results under "postgres" in the JSON."""
    from sia_grpc.observability import configure_logging

    configure_logging(level="warning")
    results = []
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        for target in ("", store) if store else ("",):
            rl = runner.run(round_latency(agents, gpus_per_agent, jobs, rounds,
                                          agents_in_process, store=target))
            ct = runner.run(create_throughput(creates, clients, store=target))
            results.append({**rl, **ct})
    if as_json:
        out = results[0] | ({"postgres": results[1]} if store else {})
        print(json.dumps(out, indent=2))
        return 0
    for r in results:
        _report(r, agents_in_process)
    return 0 if all(r["durable"] == r["accepted"] for r in results) else 1


def _report(r: dict, agents_in_process: bool) -> None:
    rl = ct = r
    print(f"store: {r['store']}")
    where = "in the controller's process" if agents_in_process else "in their own processes"
    print(f"rounds: {rl['agents']} agents ({where}), {rl['gpus']} GPUs, {rl['jobs']} jobs, "
          f"{rl['rounds']} rounds (first round {rl['first_round_ms']:.0f} ms)")
    print(f"  tick → last ack  p50 {rl['round_p50_ms']:8.1f} ms   p95 {rl['round_p95_ms']:8.1f} ms")
    print(f"  solve            p50 {rl['solve_p50_ms']:8.1f} ms   p95 {rl['solve_p95_ms']:8.1f} ms")
    print(f"  rest (dispatch)  p50 {rl['rest_p50_ms']:8.1f} ms   p95 {rl['rest_p95_ms']:8.1f} ms")
    print(f"  in the solve: estimate p50 {rl['estimate_p50_ms']:.1f} ms, build + solve "
          f"{rl['ilp_p50_ms']:.1f} ms, place {rl['place_p50_ms']:.1f} ms")
    print(f"  jobs moved a round: {', '.join(map(str, rl['moved_per_round'][1:]))} "
          f"(first round {rl['moved_per_round'][0]})")
    print("  CPU a round (p50): " + ", ".join(f"{k} {v * 1e3:.0f} ms"
                                               for k, v in rl["cpu_p50_s"].items())
          + f" (on {os.cpu_count()} cores)")
    print(f"  controller process peak RSS {rl['controller_peak_rss_mib']:.0f} MiB")
    print(f"CreateJob: {ct['clients']} clients, {ct['creates']} timed in {ct['wall_s']:.1f} s"
          f" = {ct['create_per_s']:,.0f}/s (after an untimed warm-up); durable after "
          f"shutdown: {ct['durable']} of {ct['accepted']} accepted")


__all__ = ["create_throughput", "load", "round_latency", "run", "run_load"]
