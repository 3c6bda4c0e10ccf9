"""Random `ChoiceProblem` instances shaped like Sia's ILP, for the solver tests.

Columns follow Sia's configuration set per GPU type -- 1, 2, 4, ... R GPUs on one
node, then whole-node multiples 2R, 3R, ... -- truncated at a per-job maximum
(Sia bounds how far a job may scale). Values mimic Sia's p = -0.5 objective,
``-(r * G) ** -0.5``, where G is the job's goodput on that configuration,
normalised so that its smallest value over the job's columns is N_min >= 1, and
r <= 1 discounts configurations that would force a restart. Everything is
deterministic given the numpy Generator.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from sia_grpc.policy.problem import ChoiceProblem

# The paper's heterogeneous 64-GPU cluster by type: capacity, and GPUs per node.
PAPER_TYPES: dict[str, int] = {"aws": 24, "rtx": 24, "dgx-ext": 16}
PAPER_NODE_SIZE: dict[str, int] = {"aws": 4, "rtx": 8, "dgx-ext": 8}

VALUE_MODELS = ("sia", "ties", "uniform")
DEGENERATE_KINDS = ("no_jobs", "no_columns", "empty_job", "zero_capacity", "one_job",
                    "no_types", "oversized")


# The solver's reference scales, by total GPUs: (copies of the paper cluster, jobs).
BENCH_SCALES: dict[int, tuple[int, int]] = {64: (1, 30), 2048: (32, 2000), 8192: (128, 5000)}


def paper_types(scale: int = 1) -> dict[str, int]:
    """Capacities of the paper's 64-GPU heterogeneous cluster repeated `scale` times."""
    return {t: c * scale for t, c in PAPER_TYPES.items()}


def bench_problem(rng: np.random.Generator, gpus: int) -> ChoiceProblem:
    """An instance at one of BENCH_SCALES (64, 2048 or 8192 GPUs): the paper's
    cluster scaled up, jobs that may grow to 16-64 GPUs, ~16 columns per job."""
    scale, num_jobs = BENCH_SCALES[gpus]
    return random_problem(rng, num_jobs, paper_types(scale), cols_per_job=(16, 24),
                          max_gpus=(16, 64))


def _default_node_size(name: str, capacity: int) -> int:
    if name in PAPER_NODE_SIZE and capacity % PAPER_NODE_SIZE[name] == 0:
        return PAPER_NODE_SIZE[name]
    for r in (8, 4, 2):
        if capacity % r == 0 and capacity >= r:
            return r
    return 1 if capacity else 4


def _ladder(capacity: int, node_size: int) -> np.ndarray:
    """Sia's GPU counts for one type; a zero-capacity type keeps its partial-node
    counts so that solvers see columns that can never fit."""
    r = node_size
    counts = [1 << k for k in range(r.bit_length()) if (1 << k) <= r]
    counts += [m * r for m in range(2, capacity // r + 1)]
    if capacity:
        counts = [c for c in counts if c <= capacity]
    return np.asarray(counts, dtype=np.int64)


def random_problem(
    rng: np.random.Generator,
    num_jobs: int,
    gpu_types: Mapping[str, int] | None = None,
    *,
    node_size: Mapping[str, int] | None = None,
    cols_per_job: tuple[int, int] = (1, 24),
    max_gpus: tuple[int, int] = (4, 64),
    value_model: str = "sia",
    none_value: float = -1.1,
    restrict_prob: float = 0.3,
) -> ChoiceProblem:
    """A random Sia-shaped instance.

    gpu_types: {type name: GPU capacity}; type indices follow its order
      (default: the paper's 64-GPU heterogeneous cluster).
    cols_per_job: (lo, hi) -- each job keeps a random subset of that many of its
      ladder columns (all of them when it has fewer); lo = 0 allows empty jobs.
    max_gpus: (lo, hi) -- each job's largest allocation is a power of two drawn
      log-uniformly in that range (Sia bounds how far a job may scale).
    value_model: "sia" (goodput-shaped values), "ties" (jobs copied from a few
      templates with values rounded to a coarse grid: many exact ties and
      symmetric jobs), "uniform" (values uniform in [-1.2, 0): no monotonicity).
    restrict_prob: chance that a job may only use a random subset of the types.
    """
    if value_model not in VALUE_MODELS:
        raise ValueError(f"value_model: expected one of {VALUE_MODELS}, got {value_model!r}")
    gpu_types = dict(PAPER_TYPES if gpu_types is None else gpu_types)
    names = list(gpu_types)
    caps = np.asarray([int(gpu_types[t]) for t in names], dtype=np.int64)
    sizes = [int((node_size or {}).get(t, _default_node_size(t, int(gpu_types[t]))))
             for t in names]
    ladders = [_ladder(int(c), r) for c, r in zip(caps, sizes, strict=True)]
    type_speed = rng.uniform(0.5, 2.0, size=len(names))
    lo, hi = cols_per_job

    if value_model == "ties":
        num_templates = max(1, min(num_jobs, int(rng.integers(1, 6))))
        templates = [_job_columns(rng, ladders, sizes, type_speed, lo, hi, max_gpus,
                                  "sia", restrict_prob) for _ in range(num_templates)]
        for t in templates:  # a coarse grid makes distinct columns tie exactly
            t[2][:] = np.round(t[2] * 20.0) / 20.0
        jobs = [templates[int(rng.integers(num_templates))] for _ in range(num_jobs)]
    else:
        jobs = [_job_columns(rng, ladders, sizes, type_speed, lo, hi, max_gpus,
                             value_model, restrict_prob) for _ in range(num_jobs)]

    counts = np.asarray([len(j[0]) for j in jobs], dtype=np.int64)
    col_job = np.repeat(np.arange(num_jobs, dtype=np.int64), counts)

    def cat(k: int, dt: type) -> np.ndarray:
        return np.concatenate([j[k] for j in jobs]).astype(dt) if jobs else np.zeros(0, dt)

    return ChoiceProblem(
        num_jobs=num_jobs,
        col_job=col_job,
        col_type=cat(0, np.int64),
        col_gpus=cat(1, np.int64),
        col_value=cat(2, np.float64),
        none_value=np.full(num_jobs, float(none_value)),
        capacity=caps,
    )


def _job_columns(rng, ladders, sizes, type_speed, lo, hi, max_gpus, value_model,
                 restrict_prob):
    """(types, gpus, values) of one job's columns."""
    ntypes = len(ladders)
    allowed = np.ones(ntypes, dtype=bool)
    if ntypes > 1 and rng.random() < restrict_prob:
        allowed = rng.random(ntypes) < 0.5
        if not allowed.any():
            allowed[int(rng.integers(ntypes))] = True
    job_max = 1 << int(rng.integers(max(1, max_gpus[0]).bit_length() - 1,
                                    max(1, max_gpus[1]).bit_length()))
    types, gpus = [], []
    for t in np.flatnonzero(allowed):
        g = ladders[t][ladders[t] <= max(job_max, 1)]
        if rng.random() < 0.2 and len(g) > 1:  # e.g. a job that needs >= 2 GPUs
            g = g[g >= g[int(rng.integers(len(g)))]]
        types.append(np.full(len(g), t, dtype=np.int64))
        gpus.append(g)
    types_a = np.concatenate(types) if types else np.zeros(0, dtype=np.int64)
    gpus_a = np.concatenate(gpus) if gpus else np.zeros(0, dtype=np.int64)
    k = int(rng.integers(lo, hi + 1))
    if k < len(gpus_a):
        keep = np.sort(rng.choice(len(gpus_a), size=k, replace=False))
        types_a, gpus_a = types_a[keep], gpus_a[keep]
    n = len(gpus_a)
    if value_model == "uniform":
        return types_a, gpus_a, rng.uniform(-1.2, 0.0, size=n)
    if n == 0:
        return types_a, gpus_a, np.zeros(0)
    # Goodput: per-type speed with job-specific noise, sublinear scaling in GPUs,
    # and a communication penalty once the job spans several nodes.
    speed = type_speed[types_a] * rng.lognormal(0.0, 0.3, size=ntypes)[types_a]
    alpha = rng.uniform(0.3, 1.0)
    node = np.asarray(sizes, dtype=np.int64)[types_a]
    multi = np.where(gpus_a > node, rng.uniform(0.7, 1.0), 1.0)
    goodput = speed * gpus_a.astype(float) ** alpha * multi
    n_min = 1.0 if rng.random() < 0.5 else float(rng.integers(1, 5))
    goodput = goodput / goodput.min() * n_min
    restart = np.ones(n)
    if rng.random() < 0.6:  # a running job: every column but its current one restarts it
        restart[:] = 1.0 - rng.uniform(0.0, 0.3)
        restart[int(rng.integers(n))] = 1.0
    return types_a, gpus_a, -((restart * goodput) ** -0.5)


def degenerate_problem(rng: np.random.Generator, kind: str) -> ChoiceProblem:
    """A tiny edge-case instance; `kind` is one of DEGENERATE_KINDS."""
    if kind == "no_jobs":
        return random_problem(rng, 0, {"a": 4})
    if kind == "no_types":
        n = int(rng.integers(1, 4))
        e = np.zeros(0, dtype=np.int64)
        return ChoiceProblem(n, e, e, e, np.zeros(0), np.full(n, -1.1),
                             np.zeros(0, dtype=np.int64))
    if kind == "no_columns":
        return random_problem(rng, int(rng.integers(1, 5)), {"a": 4, "b": 8},
                              cols_per_job=(0, 0))
    if kind == "empty_job":
        return random_problem(rng, int(rng.integers(2, 8)), {"a": 4, "b": 8},
                              cols_per_job=(0, 6))
    if kind == "zero_capacity":
        return random_problem(rng, int(rng.integers(1, 8)), {"a": 0, "b": 4, "c": 0},
                              restrict_prob=0.5)
    if kind == "one_job":
        return random_problem(rng, 1, {"a": int(rng.choice([1, 4, 8])), "b": 8})
    if kind == "oversized":  # every column needs more GPUs than its type has
        p = random_problem(rng, int(rng.integers(1, 5)), {"a": 2, "b": 4})
        return ChoiceProblem(p.num_jobs, p.col_job, p.col_type, p.col_gpus + 8, p.col_value,
                             p.none_value, p.capacity)
    raise ValueError(f"kind: expected one of {DEGENERATE_KINDS}, got {kind!r}")
