"""PolicyService over a real grpc.aio server: it returns exactly the decision the
policy makes on the same inputs, honours previous allocations, rejects malformed
requests on the right field, survives failures, and never over-allocates."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from sia_grpc.api import PolicyServiceStub, add_PolicyServiceServicer_to_server, pb
from sia_grpc.api.convert import allocation_from_pb
from sia_grpc.api.errors import ApiError
from sia_grpc.api.optimize import request_policy
from sia_grpc.controller.service.policy_service import PolicyService
from sia_grpc.emulation import load_app
from sia_grpc.models.bootstrap import JobGoodputModel, ThroughputEstimator
from sia_grpc.policy import (
    POLICIES,
    Adaptivity,
    PolicyJob,
    RoundResult,
    SiaConfig,
    SiaPolicy,
    make_policy,
    paper_hetero_cluster,
)

CLUSTER = paper_hetero_cluster()  # 6×4 aws, 3×8 rtx, 2×8 dgx-ext


@contextlib.asynccontextmanager
async def serve(service: PolicyService | None = None):
    server = grpc.aio.server()
    add_PolicyServiceServicer_to_server(service or PolicyService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield PolicyServiceStub(channel)
    finally:
        await server.stop(None)


@pytest.fixture
async def stub():
    async with serve() as s:
        yield s


def nodes_pb(cluster=CLUSTER) -> list[pb.NodeSpec]:
    return [pb.NodeSpec(name=n.name, gpu_type=n.gpu_type, num_gpus=n.num_gpus)
            for n in cluster.nodes]


def profile_points(app) -> list[tuple[str, int, float, float]]:
    """(type, batch, step, sync): the simulator's 1-GPU profiling pass."""
    out = []
    for t in app.gpu_types:
        seed = app.seed_profile(t)
        lo, hi = app.local_bsz_limits(t)
        sizes = (np.unique(seed.local_bsz) if seed is not None
                 else np.unique(np.geomspace(lo, hi, 10).round()))
        for b in sizes[(sizes >= lo) & (sizes <= hi)]:
            out.append((t, int(b), *app.step_time(t, 1, 1, int(b))))
    return out


@dataclass(frozen=True)
class Spec:
    """One test job from an artifact application, built both ways."""

    job_id: str
    app: str
    adaptivity: Adaptivity = Adaptivity.ADAPTIVE
    batch_size: int = 0
    num_gpus: int = 0
    min_gpus: int = 0
    max_gpus: int = 0
    allowed: tuple[str, ...] = ()
    observe: tuple[tuple[int, int], ...] = ()  # multi-GPU aws runs: (nodes, replicas)
    age_s: float = 0.0
    progress: float = 0.0
    run_time_s: float = 0.0  # on aws, as the simulator's `attained` would have it

    def observations(self):
        app = load_app(self.app)
        lo = app.local_bsz_limits("aws")[0]
        return [("aws", n, r, lo, *app.step_time("aws", n, r, lo)) for n, r in self.observe]

    def to_pb(self) -> pb.PolicyJob:
        app = load_app(self.app)
        samples = [pb.ThroughputSample(gpu_type=t, num_nodes=1, num_replicas=1,
                                       atomic_batch_size=b, step_time_s=s, sync_time_s=y,
                                       count=1) for t, b, s, y in profile_points(app)]
        samples += [pb.ThroughputSample(gpu_type=t, num_nodes=n, num_replicas=r,
                                        atomic_batch_size=b, step_time_s=s, sync_time_s=y,
                                        count=3) for t, n, r, b, s, y in self.observations()]
        grad = app.grad_params(0.0)
        return pb.PolicyJob(
            job_id=self.job_id, adaptivity={Adaptivity.ADAPTIVE: pb.ADAPTIVITY_ADAPTIVE,
                                            Adaptivity.STRONG_SCALING:
                                                pb.ADAPTIVITY_STRONG_SCALING,
                                            Adaptivity.RIGID: pb.ADAPTIVITY_RIGID}[
                                                self.adaptivity],
            min_gpus=self.min_gpus, max_gpus=self.max_gpus, num_gpus=self.num_gpus,
            allowed_gpu_types=self.allowed, batch_size=self.batch_size,
            init_batch_size=app.init_batch_size, max_batch_size=self.max_batch,
            type_batch_limits=[pb.TypeBatchLimits(gpu_type=t, min_local_batch_size=lo,
                                                  max_local_batch_size=hi)
                               for t in app.gpu_types for lo, hi in [app.local_bsz_limits(t)]],
            samples=samples, grad=pb.GradientStats(sqr=grad.sqr, var=grad.var),
            age_s=self.age_s, restart_cost_s=app.restart_delay, progress=self.progress,
            run_time_s=self.run_time_s)

    @property
    def max_batch(self) -> int:
        return max(load_app(self.app).max_batch_size, self.batch_size)

    def direct(self) -> PolicyJob:
        """The same job as the simulator would build it, without the wire."""
        app = load_app(self.app)
        est = ThroughputEstimator()
        for t, b, s, y in profile_points(app):
            est.add_profile(t, b, s, y)
        for t, n, r, b, s, y in self.observations():
            est.add_observation(t, n, r, b, 0, s, y)
        model = JobGoodputModel(estimator=est, grad=app.grad_params(0.0),
                                init_batch_size=app.init_batch_size,
                                max_batch_size=self.max_batch,
                                local_bsz_limits={t: app.local_bsz_limits(t)
                                                  for t in app.gpu_types})
        return PolicyJob(job_id=self.job_id, model=model, adaptivity=self.adaptivity,
                         min_gpus=self.min_gpus or 1, max_gpus=self.max_gpus or None,
                         allowed_types=frozenset(self.allowed) or None,
                         batch_size=self.batch_size or None, num_gpus=self.num_gpus or None,
                         age=self.age_s, restart_cost=app.restart_delay, submit_time=-self.age_s,
                         progress=self.progress,
                         attained={"aws": self.run_time_s} if self.run_time_s else {})


SPECS = [
    Spec("cifar", "cifar10"),
    Spec("bert", "bert", Adaptivity.STRONG_SCALING, batch_size=48, min_gpus=2),
    Spec("imagenet", "imagenet", Adaptivity.RIGID, batch_size=800, num_gpus=4),
    Spec("speech", "deepspeech2", allowed=("rtx",), min_gpus=2),
    Spec("yolo", "yolov3", observe=((1, 4), (2, 8))),
    Spec("ncf", "ncf", min_gpus=8),
]


def check_valid(response: pb.OptimizeResponse, request: pb.OptimizeRequest) -> None:
    """Every allocation is on real GPUs of its type, allowed for its job, of the
    right count; no GPU is held twice; no type is over capacity."""
    nodes = {n.name: n for n in request.nodes}
    jobs = {j.job_id: j for j in request.jobs}
    assert sorted(d.job_id for d in response.decisions) == sorted(jobs)
    held: Counter = Counter()
    per_type: Counter = Counter()
    for d in response.decisions:
        if not d.HasField("allocation"):
            continue
        a, job = d.allocation, jobs[d.job_id]
        assert len(a.gpus) == a.num_gpus >= 1
        assert not job.allowed_gpu_types or a.gpu_type in job.allowed_gpu_types
        for g in a.gpus:
            assert nodes[g.node].gpu_type == a.gpu_type
            assert g.index < nodes[g.node].num_gpus
            held[g.node, g.index] += 1
        per_type[a.gpu_type] += a.num_gpus
    assert max(held.values(), default=1) == 1, "a GPU is allocated twice"
    capacity = Counter()
    for n in request.nodes:
        capacity[n.gpu_type] += n.num_gpus
    assert all(per_type[t] <= capacity[t] for t in per_type)


def as_tuple(a: pb.Allocation):
    return (a.gpu_type, a.num_gpus, a.num_nodes, [(g.node, g.index) for g in a.gpus],
            a.batch_size, a.num_replicas, a.atomic_batch_size, a.accum_steps)


async def test_paper_cluster_decision_equals_the_policy_called_directly(stub):
    request = pb.OptimizeRequest(nodes=nodes_pb(), jobs=[s.to_pb() for s in SPECS])
    response = await stub.Optimize(request)
    check_valid(response, request)
    assert all(d.HasField("allocation") for d in response.decisions), "64 GPUs fit 6 jobs"
    by_id = {d.job_id: d for d in response.decisions}
    assert by_id["speech"].allocation.gpu_type == "rtx"
    assert by_id["imagenet"].allocation.num_replicas == 4
    assert by_id["imagenet"].allocation.batch_size == 800
    assert by_id["bert"].allocation.batch_size == 48
    assert by_id["ncf"].allocation.num_gpus >= 8

    want: RoundResult = SiaPolicy().optimize(CLUSTER, [s.direct() for s in SPECS], {})
    assert set(want.allocations) == set(by_id)
    for job_id, a in want.allocations.items():
        got = by_id[job_id]
        assert as_tuple(got.allocation) == (
            a.config.gpu_type, a.config.num_gpus, a.config.num_nodes,
            [(g.node, g.index) for g in a.gpus], a.batch_size, a.num_replicas, a.atomic_bsz,
            a.accum_steps), job_id
        assert got.reason == want.reasons[job_id]
        assert not got.restart
    assert response.objective == pytest.approx(want.objective)
    assert {"estimate", "solve", "place", "convert"} <= set(response.timings_ms)


async def test_sia_plus_over_the_wire_is_the_simulators_answer(stub):
    """Progress and run time reach sia-plus's remaining-work weights as the
    simulator's (per-type `attained`) do: the same decision and objective, which is
    not the one it reaches knowing nothing of how far the jobs have got (every
    weight 1)."""
    far_along = [dataclasses.replace(s, progress=p, run_time_s=r) for s, (p, r) in zip(
        SPECS, [(0.9, 36000.0), (0.1, 600.0), (0.5, 600.0), (0.2, 7200.0), (0.95, 900.0),
                (0.05, 300.0)], strict=True)]
    params = {"srpt": 1.0}
    request = pb.OptimizeRequest(nodes=nodes_pb(), jobs=[s.to_pb() for s in far_along],
                                 policy="sia-plus", params={k: str(v) for k, v in params.items()})
    response = await stub.Optimize(request)
    check_valid(response, request)
    want = make_policy("sia-plus", params).optimize(CLUSTER, [s.direct() for s in far_along], {})
    got = {d.job_id: as_tuple(d.allocation) for d in response.decisions
           if d.HasField("allocation")}
    assert got == {job_id: (a.config.gpu_type, a.config.num_gpus, a.config.num_nodes,
                            [(g.node, g.index) for g in a.gpus], a.batch_size, a.num_replicas,
                            a.atomic_bsz, a.accum_steps)
                   for job_id, a in want.allocations.items()}
    assert response.objective == pytest.approx(want.objective)
    for j in request.jobs:
        j.ClearField("progress")
    unknown = await stub.Optimize(request)
    assert unknown.objective != pytest.approx(response.objective)


TWO = [pb.NodeSpec(name="fast-0", gpu_type="fast", num_gpus=1),
       pb.NodeSpec(name="slow-0", gpu_type="slow", num_gpus=1)]


def on_slow_pb(progress: float) -> pb.OptimizeRequest:
    """tests/policy/test_policy_sia_plus.py's hand-derived job over the wire: an hour
    into its run on the slow GPU, 20% faster on the fast one (every step 1.2 times
    quicker), old enough that Sia's restart factor lets it move, restart 100 s."""
    samples = [pb.ThroughputSample(gpu_type=t, num_nodes=1, num_replicas=1,
                                   atomic_batch_size=b, step_time_s=(0.02 + 0.001 * b) / speed,
                                   count=1)
               for t, speed in (("fast", 1.2), ("slow", 1.0)) for b in (16, 64, 256)]
    job = pb.PolicyJob(job_id="a", adaptivity=pb.ADAPTIVITY_ADAPTIVE, min_gpus=1, max_gpus=1,
                       init_batch_size=128, max_batch_size=1024, samples=samples,
                       age_s=100 * 3600.0, restart_cost_s=100.0, progress=progress,
                       run_time_s=3600.0)
    prev = pb.Allocation(gpu_type="slow", num_gpus=1, num_nodes=1, gpus=gpus("slow-0", 0))
    return pb.OptimizeRequest(nodes=TWO, jobs=[job], policy="sia-plus",
                              previous=[pb.PreviousAllocation(job_id="a", allocation=prev)])


async def test_sia_plus_keeps_a_job_near_its_end_and_moves_one_far_from_it(stub):
    # Near its end: R = 3600 · 0.01 / 0.99 = 36 s; the move would save 36 · (1 − 1/1.2)
    # = 6 s, less than its 100 s restart. Far: R = 32,400 s saves 5,400 s.
    for progress, where, restart in ((0.99, "slow", False), (0.1, "fast", True)):
        d = (await stub.Optimize(on_slow_pb(progress))).decisions[0]
        assert (d.allocation.gpu_type, d.restart) == (where, restart), (progress, d.reason)
    plain = on_slow_pb(0.99)
    plain.policy = "sia"  # Sia's age-based factor alone moves it
    assert (await stub.Optimize(plain)).decisions[0].allocation.gpu_type == "fast"


def rtx_job(job_id: str, **kw) -> pb.PolicyJob:
    """Four rtx GPUs exactly, from a simple linear profile."""
    base = dict(job_id=job_id, adaptivity=pb.ADAPTIVITY_ADAPTIVE, min_gpus=4, max_gpus=4,
                init_batch_size=128, max_batch_size=1024, allowed_gpu_types=["rtx"],
                age_s=600.0, samples=[
                    pb.ThroughputSample(gpu_type=t, num_nodes=1, num_replicas=1,
                                        atomic_batch_size=b, step_time_s=0.02 + 0.001 * b,
                                        count=1)
                    for t in ("aws", "rtx", "dgx-ext") for b in (16, 64, 256)])
    return pb.PolicyJob(**{**base, **kw})


def gpus(node: str, *indices: int) -> list[pb.GpuRef]:
    return [pb.GpuRef(node=node, index=i) for i in indices]


async def test_previous_allocations_are_honoured(stub):
    # "kept": where a fresh placement would not put it, listed out of order.
    kept = pb.Allocation(gpu_type="rtx", num_gpus=4, num_nodes=1,
                         gpus=gpus("rtx-2", 7, 5, 6, 4), num_replicas=4, batch_size=128,
                         atomic_batch_size=32)
    # "moved" ran on aws, which it may no longer use.
    moved = pb.Allocation(gpu_type="aws", num_gpus=4, num_nodes=1, gpus=gpus("aws-3", 0, 1, 2, 3))
    request = pb.OptimizeRequest(
        nodes=nodes_pb(), jobs=[rtx_job("kept"), rtx_job("moved"), rtx_job("new")],
        previous=[pb.PreviousAllocation(job_id="kept", allocation=kept),
                  pb.PreviousAllocation(job_id="moved", allocation=moved)])
    response = await stub.Optimize(request)
    check_valid(response, request)
    d = {x.job_id: x for x in response.decisions}
    assert [(g.node, g.index) for g in d["kept"].allocation.gpus] == \
        [("rtx-2", 4), ("rtx-2", 5), ("rtx-2", 6), ("rtx-2", 7)]
    assert not d["kept"].restart and d["kept"].reason.startswith("kept 4 rtx")
    assert d["moved"].allocation.gpu_type == "rtx" and d["moved"].restart
    assert d["moved"].reason.startswith("moved 4 aws→4 rtx")
    assert not d["new"].restart and d["new"].reason.startswith("started")

    # The next round, fed this one's decisions, changes nothing and restarts nobody.
    again = await stub.Optimize(pb.OptimizeRequest(
        nodes=nodes_pb(), jobs=request.jobs,
        previous=[pb.PreviousAllocation(job_id=x.job_id, allocation=x.allocation)
                  for x in response.decisions]))
    assert [as_tuple(x.allocation) for x in again.decisions] == \
        [as_tuple(x.allocation) for x in response.decisions]
    assert not any(x.restart for x in again.decisions)


def small_request() -> pb.OptimizeRequest:
    return pb.OptimizeRequest(nodes=nodes_pb(), jobs=[rtx_job("a"), rtx_job("b")])


def mutate_previous_gpu(r: pb.OptimizeRequest) -> None:
    r.previous.add(job_id="a", allocation=pb.Allocation(
        gpu_type="rtx", num_gpus=4, gpus=gpus("rtx-0", 0, 1, 2, 8)))  # rtx-0 has 0..7


def mutate_previous_overlap(r: pb.OptimizeRequest) -> None:
    for job_id, idx in (("a", (0, 1, 2, 3)), ("b", (3, 4, 5, 6))):
        r.previous.add(job_id=job_id, allocation=pb.Allocation(
            gpu_type="rtx", num_gpus=4, gpus=gpus("rtx-0", *idx)))


MALFORMED = {
    "empty nodes": (lambda r: r.ClearField("nodes"), "nodes"),
    "duplicate job ids": (lambda r: r.jobs.append(rtx_job("a")), "jobs[2].job_id"),
    "unknown policy": (lambda r: setattr(r, "policy", "tetris"), "policy"),
    "adaptivity unset": (lambda r: setattr(r.jobs[1], "adaptivity", 0), "jobs[1].adaptivity"),
    "previous on a missing GPU": (mutate_previous_gpu, "previous[0].allocation.gpus"),
    "previous GPUs held twice": (mutate_previous_overlap, "previous[1].allocation.gpus"),
    "previous of an unknown job": (
        lambda r: r.previous.add(job_id="zz", allocation=pb.Allocation(
            gpu_type="rtx", num_gpus=1, gpus=gpus("rtx-0", 0))), "previous[0].job_id"),
    "previous without allocation": (lambda r: r.previous.add(job_id="a"),
                                    "previous[0].allocation"),
    "bad sample": (lambda r: setattr(r.jobs[0].samples[2], "sync_time_s", 9.0),
                   "jobs[0].samples[2].sync_time_s"),
    "unknown param": (lambda r: r.params.update(lamda="2"), "params[lamda]"),
    "bad param": (lambda r: r.params.update(p="0"), "params[p]"),
    "param of a policy without settings": (
        lambda r: (setattr(r, "policy", "gavel"), r.params.update(p="1")), "params[p]"),
    "round duration as a param": (lambda r: r.params.update(round_duration="30"),
                                  "params[round_duration]"),
    "negative round duration": (lambda r: setattr(r, "round_duration_s", -5.0),
                                "round_duration_s"),
    "NaN round duration": (lambda r: setattr(r, "round_duration_s", float("nan")),
                           "round_duration_s"),
    # Queues: the same paths as in the queues TOML, under `queues.`
    "bad queue name": (lambda r: r.queues.queue.add(name="no spaces"), "queues.queue[0].name"),
    "queue defined twice": (lambda r: r.queues.queue.extend(
        [pb.QueueSpec(name="q"), pb.QueueSpec(name="q")]), "queues.queue"),
    "bad unit weight": (lambda r: r.queues.unit_weights.update(rtx=-1.0),
                        "queues.unit_weights.rtx"),
    "unknown queue of a job": (lambda r: setattr(r.jobs[0], "queue", "research"),
                               "jobs[0].queue"),
    "unknown class of a job": (lambda r: (r.queues.SetInParent(),
                                          setattr(r.jobs[1], "priority", "urgent")),
                               "jobs[1].priority"),
    "negative stint": (lambda r: setattr(r.jobs[0], "stint_s", -1.0), "jobs[0].stint_s"),
    "progress above one": (lambda r: setattr(r.jobs[1], "progress", 1.5), "jobs[1].progress"),
    "NaN run time": (lambda r: setattr(r.jobs[0], "run_time_s", float("nan")),
                     "jobs[0].run_time_s"),
}


@pytest.mark.parametrize("case", MALFORMED)
async def test_malformed_request_is_invalid_argument_on_its_field(stub, case):
    mutate, field = MALFORMED[case]
    request = small_request()
    mutate(request)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.Optimize(request)
    err = ApiError.from_rpc_error(exc.value)
    assert err.code is grpc.StatusCode.INVALID_ARGUMENT
    assert err.field == field, err.message
    if case == "unknown policy":
        assert "choose one of sia, pollux, gavel, fifo, sia-partitioned" in err.message
    if case == "unknown param":
        assert err.message == "params[lamda]: unknown setting; did you mean lambda_?"
    if case == "bad param":
        assert err.message == "params[p]: must be a non-zero finite number, got 0"
    # The server carries on.
    ok = await stub.Optimize(small_request())
    assert all(d.HasField("allocation") for d in ok.decisions)


@pytest.mark.parametrize("policy", ["", *POLICIES])
async def test_every_policy_is_served(stub, policy):
    request = small_request()
    request.policy = policy
    response = await stub.Optimize(request)
    check_valid(response, request)
    assert all(d.HasField("allocation") for d in response.decisions)


async def test_params_change_the_policy_used(stub):
    """A λ of 0.5 (below a 1-GPU job's value for p < 0) leaves the jobs that can only
    start small out: the reply is the decision of the policy built with that
    setting, not the default's."""
    request = pb.OptimizeRequest(nodes=nodes_pb(), jobs=[s.to_pb() for s in SPECS])
    default = await stub.Optimize(request)
    assert all(d.HasField("allocation") for d in default.decisions)
    request.params["lambda"] = "0.5"
    response = await stub.Optimize(request)
    want = SiaPolicy(SiaConfig(lambda_=0.5)).optimize(CLUSTER, [s.direct() for s in SPECS], {})
    assert 0 < len(want.allocations) < len(SPECS)
    got = {d.job_id: as_tuple(d.allocation) for d in response.decisions
           if d.HasField("allocation")}
    assert set(got) == set(want.allocations)
    assert response.objective == pytest.approx(want.objective)


def test_request_policy_takes_params_and_round_duration():
    request = pb.OptimizeRequest(policy="pollux", params={"p": "-2", "hold_restoring": "true"},
                                 round_duration_s=90.0)
    policy = request_policy(request)
    assert policy.name == "pollux"
    assert (policy.config.p, policy.config.hold_restoring, policy.config.lambda_) == \
        (-2.0, True, 1000.0)
    assert policy.round_duration == 90.0
    assert request_policy(pb.OptimizeRequest(policy="gavel")).round_duration == 360.0
    assert request_policy(pb.OptimizeRequest(policy="gavel",
                                             round_duration_s=60)).round_duration == 60.0


async def test_job_without_samples_waits_with_a_reason(stub):
    """A job still being profiled is not an error: it waits, and says why."""
    request = small_request()
    del request.jobs[1].samples[:]
    response = await stub.Optimize(request)
    d = {x.job_id: x for x in response.decisions}
    assert d["a"].HasField("allocation") and not d["b"].HasField("allocation")
    assert "no estimate" in d["b"].reason


@dataclass(frozen=True)
class Broken:
    name: str = "broken"
    round_duration: float = 60.0

    def optimize(self, cluster, jobs, previous):
        raise RuntimeError("secret internals")


_release = threading.Event()


@dataclass(frozen=True)
class Stuck:
    name: str = "stuck"
    round_duration: float = 60.0

    def optimize(self, cluster, jobs, previous):
        _release.wait(10)
        return SiaPolicy().optimize(cluster, jobs, previous)


async def test_policy_failure_is_internal_logged_and_not_leaked():
    async with serve(PolicyService(policies={"sia": SiaPolicy, "broken": Broken})) as s:
        request = small_request()
        request.policy = "broken"
        with capture_logs() as logs, pytest.raises(grpc.aio.AioRpcError) as exc:
            await s.Optimize(request)
        assert exc.value.code() is grpc.StatusCode.INTERNAL
        assert "secret" not in exc.value.details()
        assert [e["event"] for e in logs] == ["policy_service.optimize_failed"]
        assert logs[0]["log_level"] == "error" and logs[0]["exc_info"]
        assert len((await s.Optimize(small_request())).decisions) == 2


async def test_slow_policy_times_out_and_the_server_carries_on():
    _release.clear()
    with ThreadPoolExecutor(2) as pool:
        service = PolicyService(executor=pool, timeout_s=0.2,
                                policies={"sia": SiaPolicy, "stuck": Stuck})
        async with serve(service) as s:
            request = small_request()
            request.policy = "stuck"
            try:
                with pytest.raises(grpc.aio.AioRpcError) as exc:
                    await s.Optimize(request)
            finally:
                _release.set()
            err = ApiError.from_rpc_error(exc.value)
            assert (err.code, err.reason) == (grpc.StatusCode.DEADLINE_EXCEEDED, "POLICY_TIMEOUT")
            # Through the same executor, a normal call still works.
            assert len((await s.Optimize(small_request())).decisions) == 2


async def test_calls_run_off_the_event_loop():
    """While one call is stuck in its worker, others are still answered: the event
    loop is never blocked by a round."""
    _release.clear()
    service = PolicyService(policies={"sia": SiaPolicy, "stuck": Stuck})
    async with serve(service) as s:
        stuck_request = small_request()
        stuck_request.policy = "stuck"
        stuck = asyncio.ensure_future(s.Optimize(stuck_request))
        try:
            request = pb.OptimizeRequest(nodes=nodes_pb(), jobs=[x.to_pb() for x in SPECS[:3]])
            first, second = await asyncio.wait_for(
                asyncio.gather(s.Optimize(request), s.Optimize(request)), 10)
            assert not stuck.done()
        finally:
            _release.set()
        # Stateless: the same input gives the same answer.
        assert (first.decisions, first.objective) == (second.decisions, second.objective)
        assert (await stuck).decisions == (await s.Optimize(small_request())).decisions


# -- property: random well-formed requests never over-allocate ------------------------------

TYPES = ("a", "b", "c")


@st.composite
def requests(draw) -> pb.OptimizeRequest:
    nodes = []
    for t in draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True)):
        for k in range(draw(st.integers(1, 3))):
            nodes.append(pb.NodeSpec(name=f"{t}-{k}", gpu_type=t,
                                     num_gpus=draw(st.sampled_from([1, 2, 4, 6, 8]))))
    jobs = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from([pb.ADAPTIVITY_ADAPTIVE, pb.ADAPTIVITY_STRONG_SCALING,
                                     pb.ADAPTIVITY_RIGID]))
        pipeline = draw(st.sampled_from([0, 1, 2]))
        n = draw(st.sampled_from([1, 2, 4, 8])) * max(pipeline, 1)
        speed = {t: draw(st.floats(0.2, 5.0)) for t in TYPES}
        jobs.append(pb.PolicyJob(
            job_id=f"j{i}", adaptivity=kind, init_batch_size=64, max_batch_size=2048,
            batch_size=0 if kind == pb.ADAPTIVITY_ADAPTIVE else 256,
            num_gpus=n if kind == pb.ADAPTIVITY_RIGID else 0, pipeline_gpus=pipeline,
            min_gpus=max(pipeline, 1),
            max_gpus=0 if kind == pb.ADAPTIVITY_RIGID else draw(st.sampled_from([0, 8, 16])),
            allowed_gpu_types=draw(st.lists(st.sampled_from(TYPES), max_size=2, unique=True)),
            age_s=draw(st.sampled_from([0.0, 100.0, 5000.0])),
            samples=[pb.ThroughputSample(gpu_type=t, num_nodes=1, num_replicas=1,
                                         atomic_batch_size=b,
                                         step_time_s=(0.01 + 0.002 * b) / speed[t],
                                         sync_time_s=0.0, count=1)
                     for t in TYPES for b in (8, 32, 128)]))
    return pb.OptimizeRequest(nodes=nodes, jobs=jobs,
                              policy=draw(st.sampled_from(["", "pollux", "gavel", "fifo"])))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=requests())
async def test_random_requests_never_overlap_or_overflow(stub, request):
    first = await stub.Optimize(request)
    check_valid(first, request)
    # The next round from this one's decisions: previous GPUs are kept or released cleanly.
    request.previous.extend(pb.PreviousAllocation(job_id=d.job_id, allocation=d.allocation)
                            for d in first.decisions if d.HasField("allocation"))
    check_valid(await stub.Optimize(request), request)


def queued_request(queues: pb.QueueConfig) -> pb.OptimizeRequest:
    """4-rtx jobs: three of `batch` holding 12 of the 24 rtx GPUs, three more of it and
    two of `research` (class production) new."""
    jobs = [rtx_job(f"b{k}", queue="batch", stint_s=3600.0) for k in range(3)]
    jobs += [rtx_job(f"r{k}", queue="research", priority="production") for k in range(2)]
    jobs += [rtx_job(f"x{k}", queue="batch") for k in range(3)]
    request = pb.OptimizeRequest(nodes=nodes_pb(), jobs=jobs, queues=queues, previous=[
        pb.PreviousAllocation(job_id=f"b{k}", allocation=pb.Allocation(
            gpu_type="rtx", num_gpus=4, num_nodes=1, gpus=gpus(f"rtx-{k}", 0, 1, 2, 3),
            num_replicas=4, batch_size=128, atomic_batch_size=32)) for k in range(3)])
    return request


QUEUES_PB = pb.QueueConfig(
    queue=[pb.QueueSpec(name="research", guarantee={"rtx": 8}),
           pb.QueueSpec(name="batch", borrow_limit={"rtx": 8})],
    priority_class=[pb.PriorityClassSpec(name="production", weight=10)])


async def test_queues_without_rows_weigh_priorities_and_report_what_each_queue_holds(stub):
    cfg = pb.QueueConfig(queue=[pb.QueueSpec(name="research"), pb.QueueSpec(name="batch")],
                         priority_class=[pb.PriorityClassSpec(name="production", weight=10)])
    request = queued_request(cfg)
    response = await stub.Optimize(request)
    check_valid(response, request)
    held = {u.queue: dict(u.gpus) for u in response.queues}
    assert set(held) == {"research", "batch", "default"}
    queue_of = {j.job_id: j.queue for j in request.jobs}
    for q in ("research", "batch"):
        assert held[q]["rtx"] == sum(d.allocation.num_gpus for d in response.decisions
                                     if queue_of[d.job_id] == q)
    assert not response.rows  # no guarantee, limit nor budget: no side rows


async def test_queues_in_the_request_give_the_policys_own_answer(stub):
    """Another orchestrator gets what the controller's rounds would: the policy called
    on the same jobs and queues."""
    from sia_grpc.api.convert import policy_job_from_pb, queues_from_pb

    request = queued_request(QUEUES_PB)
    response = await stub.Optimize(request)
    check_valid(response, request)
    jobs = [policy_job_from_pb(j, f"jobs[{i}]") for i, j in enumerate(request.jobs)]
    previous = {p.job_id: allocation_from_pb(p.allocation, CLUSTER, "p") for p in request.previous}
    want = SiaPolicy().optimize(CLUSTER, jobs, previous, queues=queues_from_pb(QUEUES_PB))
    got = {d.job_id: d for d in response.decisions}
    assert {j for j, d in got.items() if d.HasField("allocation")} == set(want.allocations)
    for job_id, a in want.allocations.items():
        assert [(g.node, g.index) for g in got[job_id].allocation.gpus] == \
            [(g.node, g.index) for g in a.gpus]
    held = {u.queue: dict(u.gpus) for u in response.queues}
    assert held["research"]["rtx"] >= 8 and held["batch"].get("rtx", 0) <= 8
    rows = {r.name: r for r in response.rows}
    assert rows["guarantee research/rtx"].binding
    assert (rows["guarantee research/rtx"].activity, rows["guarantee research/rtx"].bound) == \
        want.rows["guarantee research/rtx"]
