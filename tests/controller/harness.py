"""Drive `ControllerState` with no sockets: solves run inline, and a perfect
in-memory "cluster" of agents answers directives the way real agents do. The
agents' own view of which job runs on which GPU is the ground truth the
invariants are checked against."""

from __future__ import annotations

from dataclasses import dataclass, field

from sia_grpc.api import pb
from sia_grpc.controller.machine.records import JobRec
from sia_grpc.controller.machine.rounds import ROUND_MOVES_KEPT
from sia_grpc.controller.machine.state import (
    SUBMITTED,
    Action,
    AgentMessage,
    AgentRegistered,
    ControllerSettings,
    ControllerState,
    Event,
    Happened,
    JobCreated,
    Persist,
    QueuesLoaded,
    RoundDone,
    Send,
    Solve,
    SolveFinished,
    Tick,
)
from sia_grpc.emulation import load_app
from sia_grpc.policy import make_policy
from sia_grpc.policy.queues import QueueSet


@dataclass
class FakeAgent:
    name: str
    gpu_type: str
    num_gpus: int
    running: dict[str, tuple[int, tuple[int, ...], float]] = field(default_factory=dict)
    busy: dict[int, str] = field(default_factory=dict)  # GPU -> job, as the agent sees it
    up: bool = True
    draining: bool = False  # told by a Drain: it refuses new RUNs, as real agents do
    # Profiling passes in flight (GPU -> its request), answered by `finish_profiles`;
    # with hold_profiles False a pass answers at once.
    passes: dict[int, pb.ProfileRequest] = field(default_factory=dict)
    hold_profiles: bool = False
    # A STOP's exit inside its ack (`Registered.acks_carry_exits`, as the controller
    # offers and real agents do), else as a message of its own before the ack.
    acks_carry_exits: bool = False

    def register_event(self, at: float) -> AgentRegistered:
        return AgentRegistered(at, self.name, self.gpu_type, self.num_gpus, "test",
                               tuple((j, g, gp) for j, (g, gp, _) in self.running.items()),
                               tuple((p.job_id, p.generation, g) for g, p in self.passes.items()),
                               self.draining)


class Harness:
    def __init__(self, nodes: dict[str, tuple[str, int]], *, policy: str = "sia",
                 settings: ControllerSettings | None = None, queues: QueueSet | None = None,
                 acks_carry_exits: bool | None = None):
        self.state = ControllerState(settings or ControllerSettings(heartbeat_timeout=30.0))
        self.solves: list[Solve] = []  # every solve, in order
        self.round_done: list[RoundDone] = []
        self.happened: list[Happened] = []  # the events of the history it gave out
        self.policy = make_policy(policy)
        self.now = 1_000.0
        # (None: every other agent sends a STOP's exit in its ack, so that every test
        # runs both ways of saying it)
        self.agents = {n: FakeAgent(n, t, k, acks_carry_exits=(
            k_ % 2 == 1 if acks_carry_exits is None else acks_carry_exits))
            for k_, (n, (t, k)) in enumerate(nodes.items())}
        self.outbox: list[Send] = []
        self.persisted: set[str] = set()
        # Each job's (state, reason) as the store holds it: as created, then as each
        # Persist wrote it (`check`: never behind the state machine's).
        self.stored: dict[str, tuple[int, str]] = {}
        self.rounds = 0
        for a in self.agents.values():
            self.feed(a.register_event(self.now))
        if queues is not None:
            self.feed(QueuesLoaded(self.now, queues))

    # ---------------------------------------------------------------- driving

    def feed(self, event: Event) -> list[Action]:
        if isinstance(event, JobCreated):  # (the shell stores it so before the event)
            self.stored[event.job.job_id] = SUBMITTED
        actions = self.state.handle(event)
        for a in actions:
            if isinstance(a, Send):
                self.outbox.append(a)
            elif isinstance(a, Persist):
                self.persisted.update(a.job_ids)
                for job_id in a.job_ids:
                    # (dict.get: not a lookup of the state machine's, for tests that count)
                    rec = dict.get(self.state.job_book.jobs, job_id)
                    if rec is not None:
                        self.stored[job_id] = (rec.job.status.state, rec.job.status.reason)
            elif isinstance(a, Happened):
                self.happened.append(a)
            elif isinstance(a, RoundDone):
                # The jobs a round counts as moved, it lists (Round.moves), up to its bound.
                assert len(a.round.moves) == min(a.round.jobs_moved, ROUND_MOVES_KEPT), a.round
                self.round_done.append(a)
            elif isinstance(a, Solve):
                self.solves.append(a)
                result = self.policy.optimize(a.cluster, list(a.jobs), dict(a.previous),
                                              queues=a.queues)
                self.rounds += 1
                self.feed(SolveFinished(self.now, a.round_no, result))
        self.check()
        return actions

    def submit(self, job_id: str, application: str = "cifar10", **spec) -> None:
        spec.setdefault("adaptivity", pb.ADAPTIVITY_ADAPTIVE)
        # Each job its own program unless a test says otherwise: else a later job
        # would reuse an earlier one's profiles (`Profiling._reuse_profiles`).
        spec.setdefault("command", [f"train-{job_id}"])
        job = pb.Job(job_id=job_id, spec=pb.JobSpec(name=job_id, application=application, **spec))
        job.status.create_time.FromNanoseconds(int(self.now * 1e9))
        self.feed(JobCreated(self.now, job))

    def run(self, job_id: str, application: str = "cifar10", **spec) -> JobRec:
        """Submit a job, profile it, and run it after a round: its record."""
        self.submit(job_id, application, **spec)
        self.deliver()
        self.tick()
        self.deliver()
        return self.state.jobs[job_id]

    def tick(self, seconds: float = 60.0, trigger: str = "timer") -> None:
        self.now += seconds
        self.heartbeat()
        self.feed(Tick(self.now, trigger, early=trigger != "timer"))

    def heartbeat(self) -> None:
        for a in self.agents.values():
            if a.up:
                self.feed(AgentMessage(self.now, a.name, pb.AgentMessage(heartbeat=pb.Heartbeat())))

    def deliver(self, max_steps: int = 1000) -> None:
        """Let the agents answer everything sent, until nothing is left."""
        for _ in range(max_steps):
            if not self.outbox:
                return
            send = self.outbox.pop(0)
            agent = self.agents[send.node_id]
            if agent.up:
                for reply in self._answer(agent, send.message):
                    self.feed(AgentMessage(self.now, agent.name, reply))
        raise AssertionError("directives kept coming")

    def complete(self, job_id: str, kind: int = pb.JobExit.KIND_COMPLETED,
                 message: str = "") -> None:
        """The job's rank-0 node reports it finished (or, with `kind`, failed)."""
        for agent in self.agents.values():
            run = agent.running.get(job_id)
            if run is not None and run[2] == 0:
                self._drop(agent, job_id)
                self.feed(AgentMessage(self.now, agent.name, pb.AgentMessage(exit=pb.JobExit(
                    job_id=job_id, generation=run[0], kind=kind, message=message,
                    progress=1.0 if kind == pb.JobExit.KIND_COMPLETED else 0.0))))
                return
        raise AssertionError(f"{job_id} runs nowhere")

    # ---------------------------------------------------------------- agents

    def _answer(self, agent: FakeAgent, msg: pb.ControllerMessage) -> list[pb.AgentMessage]:
        kind = msg.WhichOneof("kind")
        if kind == "profile":
            p = msg.profile
            if p.local_gpu in agent.busy or agent.passes.get(p.local_gpu, p).job_id != p.job_id:
                return [refused_pass(p)]
            agent.passes[p.local_gpu] = p
            return [] if agent.hold_profiles else self._profiled(agent, p.local_gpu)
        if kind == "drain":
            agent.draining = not msg.drain.cancel
            return []
        d = msg.directive
        ack = pb.DirectiveAck(directive_id=d.directive_id, job_id=d.job_id,
                              generation=d.generation, ok=True)
        out = []
        if d.action == pb.Directive.ACTION_RUN and agent.draining:
            ack.ok, ack.error = False, "node draining"
        elif d.action == pb.Directive.ACTION_STOP:
            # A STOP ends the job's passes there too (nodeagent.profiling.Profiler.stop).
            for g in [g for g, p in agent.passes.items() if p.job_id == d.job_id]:
                del agent.passes[g]
            run = agent.running.get(d.job_id)
            if run is not None and run[0] <= d.generation:
                self._drop(agent, d.job_id)
                ex = pb.JobExit(job_id=d.job_id, generation=run[0],
                                kind=pb.JobExit.KIND_CHECKPOINTED, progress=0.5)
                if agent.acks_carry_exits:
                    ack.exit.CopyFrom(ex)
                else:
                    out.append(pb.AgentMessage(exit=ex))
        else:
            if d.job_id in agent.running:
                self._drop(agent, d.job_id)
            for g in d.local_gpus:
                assert g < agent.num_gpus, f"{agent.name}: GPU {g} does not exist"
                assert g not in agent.busy, (
                    f"{agent.name}/{g}: RUN {d.job_id} while {agent.busy[g]} still runs there")
                assert g not in agent.passes, (
                    f"{agent.name}/{g}: RUN {d.job_id} while {agent.passes[g].job_id} profiles")
                agent.busy[g] = d.job_id
            agent.running[d.job_id] = (d.generation, tuple(d.local_gpus), d.world.rank_offset)
            a = d.allocation
            out.append(pb.AgentMessage(telemetry=pb.Telemetry(
                job_id=d.job_id, generation=d.generation, progress=0.1,
                grad=pb.GradientStats(sqr=1.0, var=5.0),
                samples=[pb.ThroughputSample(
                    gpu_type=agent.gpu_type, num_nodes=a.num_nodes,
                    num_replicas=a.num_replicas, atomic_batch_size=a.atomic_batch_size,
                    accum_steps=a.accum_steps, step_time_s=0.2, sync_time_s=0.05, count=10)])))
        out.append(pb.AgentMessage(ack=ack))
        return out

    def finish_profiles(self) -> None:
        """Every pass in flight on an agent that is up reports its samples."""
        for agent in self.agents.values():
            if agent.up:
                for g in sorted(agent.passes):
                    for reply in self._profiled(agent, g):
                        self.feed(AgentMessage(self.now, agent.name, reply))

    @staticmethod
    def _profiled(agent: FakeAgent, gpu: int) -> list[pb.AgentMessage]:
        return [pass_result(agent.gpu_type, agent.passes.pop(gpu))]

    @staticmethod
    def _drop(agent: FakeAgent, job_id: str) -> None:
        _, gpus, _ = agent.running.pop(job_id)
        for g in gpus:
            del agent.busy[g]

    # ---------------------------------------------------------------- invariants

    def check(self) -> None:
        """The state machine's own rules (`check_invariants`); the agents check the
        ground truth themselves (no RUN on a GPU that is busy). And the rule of the
        record: a job's state and reason change only with a Persist, so what the store
        holds (and `sia watch`, the dashboard and the event history show) is what the
        state machine holds, after every event."""
        self.state.check_invariants()
        for job_id, rec in self.state.jobs.items():
            live = (rec.job.status.state, rec.job.status.reason)
            # (a job a test restored into the state itself: from its first Persist on)
            assert self.stored.get(job_id, live) == live, (
                f"{job_id}: {live} in memory only; the store has {self.stored.get(job_id)}")

    def assert_no_gpu_held(self) -> None:
        """Once every job has ended and every message is delivered, nothing is held."""
        held = {n.name: dict(n.holder) for n in self.state.nodes.values() if n.holder}
        assert not held, f"GPUs still held with every job ended: {held}"

    def state_of(self, job_id: str) -> int:
        return self.state.jobs[job_id].job.status.state


def refused_pass(p: pb.ProfileRequest) -> pb.AgentMessage:
    """The real agent's answer to a pass on a GPU it has busy: a pass that never ran."""
    return pb.AgentMessage(telemetry=pb.Telemetry(
        job_id=p.job_id, generation=p.generation, profile=True, profile_refused=True,
        profile_error="GPU busy", profile_gpu=p.local_gpu))


def pass_result(gpu_type: str, p: pb.ProfileRequest) -> pb.AgentMessage:
    """A finished pass: the application's step times at each requested batch size."""
    app = load_app(p.spec.application)
    t = pb.Telemetry(job_id=p.job_id, generation=p.generation, profile=True,
                     profile_gpu=p.local_gpu)
    if gpu_type in app.gpu_types:
        for b in p.local_batch_sizes:
            step, sync = app.step_time(gpu_type, 1, 1, b)
            t.samples.add(gpu_type=gpu_type, num_nodes=1, num_replicas=1, atomic_batch_size=b,
                          step_time_s=step, sync_time_s=sync, count=5)
    return pb.AgentMessage(telemetry=t)
