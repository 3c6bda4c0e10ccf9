"""An opted-in job's state as it lives in its Slurm comment, and the environment
its batch script takes from it (`sia-slurm env`).

Standard library only: `sia-slurm env` runs at the start of every copy of every
job, before its command, so what it imports is paid on every start and every
move (the rest of the bridge, with the policy and scipy, takes seconds to import).

    sia1:{"id":"41","spec":{...},"t0":1796146369.0,"moves":0,"shape":{...}}

`id` is the sia job id (the Slurm id of the job `sia slurm submit` created; it
stays when the bridge moves the job to a new Slurm job), `spec` the job spec
(`sia_grpc.client.spec` mapping, without the command: that is the batch script),
`t0` the submission time, `moves` how many times the bridge has moved it, `shape`
the allocation the bridge gave it (absent: waiting for Sia, held; its `nodes` the
(node, GPUs) Sia placed it on, which Slurm is asked for), `obs`, `grad`
and `p` (progress, the fraction of its target done) what its workers reported,
`at` when it was given its shape (until its first report), `rc` its measured
restart cost, `run` when its copy first reported (it has run since) and `ran` the
seconds its earlier copies ran.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sia_grpc.api import pb

__all__ = ["COMMENT_MAX", "COMMENT_TAG", "SPEC_ROOM", "Observation", "Shape", "Ticket",
           "TicketTooLong", "env_exports", "job_environment"]

COMMENT_TAG = "sia1:"
# The longest job comment Slurm keeps (22.05: longer ones are refused, "Pathname of a
# file, directory or other parameter too long", by sbatch and scontrol update alike).
COMMENT_MAX = 1024
# The most of it a job's spec may take (`sia slurm submit` refuses more): the rest
# is for its shape (with a node list), its workers' statistics and its clocks.
SPEC_ROOM = COMMENT_MAX - 400


class TicketTooLong(ValueError):
    """A ticket that cannot fit in a Slurm comment even without its step times."""


@dataclass(frozen=True)
class Shape:
    """An allocation the bridge gave a job: what it asked Slurm for, and the batch."""

    gpu_type: str
    gres_type: str
    num_gpus: int
    num_nodes: int
    batch_size: int = 0
    atomic_batch_size: int = 0
    accum_steps: int = 0
    num_replicas: int = 0
    # Where Sia placed it: (node, GPUs) pairs, what the bridge pins Slurm to (none in
    # tickets from before pinning, or for an allocation that names no GPUs).
    nodes: tuple[tuple[str, int], ...] = ()

    @property
    def node_names(self) -> str:
        """The pinned nodes as Slurm's node list ("" for none)."""
        return ",".join(n for n, _ in self.nodes)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in vars(self).items() if k != "nodes"}
        if self.nodes:
            data["nodes"] = [list(p) for p in self.nodes]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Shape:
        nodes = tuple((str(n), int(c)) for n, c in data.get("nodes", ()))
        return cls(**{**data, "nodes": nodes})

    @property
    def batch(self) -> tuple[int, int, int]:
        """(global batch, atomic batch, accumulation steps): what a batch change
        without a move changes."""
        return self.batch_size, self.atomic_batch_size, self.accum_steps

    def same_place(self, other: Shape | None) -> bool:
        """The same GPU type, count and node count: what Slurm is asked for."""
        return other is not None and (self.gpu_type, self.num_gpus, self.num_nodes) == (
            other.gpu_type, other.num_gpus, other.num_nodes)


# An observed step time: [gpu_type, nodes, replicas, atomic batch, accum steps, count,
# mean step s, mean sync s], as the workers reported them (merged per shape).
Observation = tuple[str, int, int, int, int, int, float, float]


@dataclass(frozen=True)
class Ticket:
    """An opted-in job's state, kept in its Slurm comment (module docstring)."""

    id: str
    spec: Mapping[str, Any]
    submitted: float
    moves: int = 0
    shape: Shape | None = None
    obs: tuple[Observation, ...] = ()  # the workers' step times, per shape
    grad: tuple[float, float] | None = None  # the workers' latest (sqr, var)
    # When (the bridge's clock) the bridge gave the job its shape, until the copy's
    # first report; then the seconds between the two, for a copy that replaced a
    # running one (moves > 0): what the last move cost the job end to end (the old
    # copy's checkpoint, Slurm's launch, the restore), the policy's restart cost.
    placed: float | None = None
    restart_s: float | None = None
    # The same for its first start (moves == 0: no old copy to stop): what Slurm's
    # scheduling and launch cost beyond the application's start, measured before
    # any move (`prices.measured_share`).
    launch_s: float | None = None
    progress: float = 0.0  # the workers' latest fraction of the target done
    # How long it has run (the bridge's clock, as `placed`): its earlier copies'
    # seconds from their first report to their move, and when the current copy first
    # reported (None: it has not yet). What its progress was made in.
    ran: float = 0.0
    running_since: float | None = None

    def run_time(self, now: float, *, launched: bool = True) -> float:
        """Seconds it has run, its current copy's too while Slurm runs it."""
        current = now - self.running_since if launched and self.running_since is not None else 0
        return self.ran + max(current, 0.0)

    def comment(self) -> str:
        """The ticket as its Slurm comment, at most `COMMENT_MAX` characters: the step
        times to 4 significant digits, and where they do not all fit, those of the
        fewest steps left out (a job that has run many shapes; unbounded, they made
        every update of the job's comment fail, and the bridge could neither record
        its reports nor start it again). TicketTooLong if even none fit."""
        data: dict[str, Any] = {"id": self.id, "spec": dict(self.spec), "t0": self.submitted,
                                "moves": self.moves}
        if self.shape is not None:
            data["shape"] = self.shape.to_json()
        if self.grad is not None:
            data["grad"] = list(self.grad)
        if self.placed is not None:
            data["at"] = self.placed
        if self.restart_s is not None:
            data["rc"] = self.restart_s
        if self.launch_s is not None:
            data["lc"] = self.launch_s
        if self.progress:
            data["p"] = self.progress
        if self.ran:
            data["ran"] = self.ran
        if self.running_since is not None:
            data["run"] = self.running_since
        # (most steps first: what is left out first is what the fewest steps measured)
        obs = [[t, n, r, b, a, c, float(f"{st:.4g}"), float(f"{sy:.4g}")]
               for t, n, r, b, a, c, st, sy in sorted(self.obs, key=lambda o: -o[5])]
        while True:
            if obs:
                data["obs"] = obs
            text = COMMENT_TAG + json.dumps(data, separators=(",", ":"), sort_keys=True)
            if len(text) <= COMMENT_MAX:
                return text
            if not obs:
                raise TicketTooLong(f"the job's ticket is {len(text)} characters, more than "
                                    f"the {COMMENT_MAX} Slurm keeps in a job's comment")
            obs = obs[:-1]
            data.pop("obs")

    def observe(self, t: pb.Telemetry) -> Ticket:
        """With the step times and gradient statistics of a worker report merged in
        (times averaged per shape, weighted by steps; the latest statistics)."""
        merged = {o[:5]: o for o in self.obs}
        for s in t.samples:
            key = (s.gpu_type, s.num_nodes, s.num_replicas, s.atomic_batch_size, s.accum_steps)
            n = max(s.count, 1)
            _, _, _, _, _, m, step, sync = merged.get(key, (*key, 0, 0.0, 0.0))
            merged[key] = (*key, m + n, (step * m + s.step_time_s * n) / (m + n),
                           (sync * m + s.sync_time_s * n) / (m + n))
        grad = (t.grad.sqr, t.grad.var) if t.HasField("grad") else self.grad
        # (a copy restored from an older checkpoint reports less for a while: the
        # furthest the job got stands, as the controller keeps it)
        progress = max(self.progress, min(t.progress, 1.0))
        return replace(self, obs=tuple(sorted(merged.values())), grad=grad, progress=progress)

    @classmethod
    def parse(cls, comment: str, job_id: int) -> Ticket | None:
        """The ticket in `comment`, or None for a job that is not opted in. The
        first ticket (from `sia slurm submit`) has no id yet: the job's own."""
        if not comment.startswith(COMMENT_TAG):
            return None
        try:
            data = json.loads(comment[len(COMMENT_TAG):])
            shape, grad = data.get("shape"), data.get("grad")
            placed, cost, since = data.get("at"), data.get("rc"), data.get("run")
            launch = data.get("lc")
            obs = tuple((str(t), int(n), int(r), int(b), int(a), int(c), float(st), float(sy))
                        for t, n, r, b, a, c, st, sy in data.get("obs", ()))
            return cls(id=str(data.get("id") or job_id), spec=dict(data["spec"]),
                       submitted=float(data.get("t0", 0.0)), moves=int(data.get("moves", 0)),
                       shape=Shape.from_json(shape) if shape else None, obs=obs,
                       grad=(float(grad[0]), float(grad[1])) if grad else None,
                       placed=None if placed is None else float(placed),
                       restart_s=None if cost is None else float(cost),
                       launch_s=None if launch is None else float(launch),
                       progress=float(data.get("p", 0.0)), ran=float(data.get("ran", 0.0)),
                       running_since=None if since is None else float(since))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None  # not ours after all: left alone, as Slurm's own


def job_environment(ticket: Ticket) -> dict[str, str]:
    """The SIA_* variables the job's batch script exports (`sia-slurm env`), as a
    node agent gives its workers: the sia job id, its generation, its target, and
    the shape."""
    env = {"SIA_JOB_ID": ticket.id, "SIA_GENERATION": str(ticket.moves)}
    for key, name in (("epochs", "SIA_TARGET_EPOCHS"), ("samples", "SIA_TARGET_SAMPLES")):
        if key in ticket.spec:  # the spec's target, over the script's own
            env[name] = str(ticket.spec[key])
    s = ticket.shape
    if s is not None:
        env.update(SIA_GPU_TYPE=s.gpu_type, SIA_NUM_GPUS=str(s.num_gpus),
                   SIA_NUM_NODES=str(s.num_nodes))
        for name, value in (("SIA_BATCH_SIZE", s.batch_size),
                            ("SIA_ATOMIC_BATCH_SIZE", s.atomic_batch_size),
                            ("SIA_ACCUM_STEPS", s.accum_steps)):
            if value:
                env[name] = str(value)
    return env


def env_exports(job_id: str, jobs_json: Mapping) -> str:
    """`export SIA_...=...` lines for Slurm job `job_id` (from its ticket; "" for a
    job that is not opted in)."""
    for j in jobs_json.get("jobs", []):
        if str(j.get("job_id")) == job_id:
            ticket = Ticket.parse(j.get("comment") or "", int(job_id))
            if ticket is None:
                return ""
            return "".join(f"export {k}={shlex.quote(v)}\n"
                           for k, v in job_environment(ticket).items())
    return ""
