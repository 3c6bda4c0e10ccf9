"""`sia report RESULTS.json`: the simulator's metrics per trace group and policy
(mean ± std over the group's workloads) beside the paper's Table 3."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# The paper's Table 3 (heterogeneous 64 GPUs), average JCT in hours, and Sia's
# p99 JCT, as the artifact's README quotes them. Helios = the saturn traces.
PAPER_AVG_JCT_H = {
    "philly": {"sia": 0.6, "pollux": 1.0, "gavel": 1.9},
    "saturn": {"sia": 0.7, "pollux": 1.0, "gavel": 2.5},
    "newtrace": {"sia": 0.7, "pollux": 1.5, "gavel": 11.3},
}
PAPER_SIA_P99_H = {"philly": 9.5, "saturn": 10.9, "newtrace": 4.6}
GROUP_TITLE = {"philly": "Philly", "saturn": "Helios (saturn)", "newtrace": "newTrace"}
FIELDS = ("avg_jct_h", "p99_jct_h", "makespan_h", "gpu_hours_per_job", "restarts_per_job",
          "contention_mean", "contention_max", "ftf_worst", "unfair_fraction",
          "policy_ms_median", "policy_ms_p95", "cpu_seconds")


def _group(workload: str) -> str:
    return Path(workload).parent.name or workload.split("/")[0]


def collect(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """group → policy → field → values over the group's workloads."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for run in runs:
        cell = out[_group(run["workload"])][run["policy"]]
        for f in FIELDS:
            v = run["cpu_seconds"] if f == "cpu_seconds" else run["metrics"].get(f)
            if v is not None:
                cell[f].append(float(v))
    return out


def _order(label: str) -> int:
    """sia, pollux, gavel, fifo, then anything else; a policy's labelled variants
    (`sia(p=-1)`, from `--set`) with it, in the order they were run."""
    base = label.partition("(")[0]
    known = ("sia", "pollux", "gavel", "fifo")
    return known.index(base) if base in known else len(known)


def _ms(values: list[float], digits: int = 2) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def markdown(runs: Sequence[Mapping[str, Any]], command: str = "") -> str:
    data = collect(runs)
    lines = ["# Simulator results beside the paper's Table 3", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["Cells are mean ± std over the group's workloads (population std). "
              "Paper: Table 3 of the Sia paper, heterogeneous 64-GPU cluster.", ""]
    for group in sorted(data, key=lambda g: list(GROUP_TITLE).index(g)
                        if g in GROUP_TITLE else 99):
        policies = data[group]
        n = max(len(v.get("avg_jct_h", [])) for v in policies.values())
        lines += [f"## {GROUP_TITLE.get(group, group)} ({n} workloads)", ""]
        lines += ["| policy | avg JCT h | paper | p99 JCT h | makespan h | GPU h/job | "
                  "restarts/job | contention mean | max | worst FTF | unfair | "
                  "policy ms p50 | p95 | CPU s/run |",
                  "|" + "---|" * 14]
        for policy in sorted(policies, key=_order):
            c = policies[policy]
            paper = PAPER_AVG_JCT_H.get(group, {}).get(policy)
            lines.append(
                f"| {policy} | {_ms(c['avg_jct_h'])} | {paper if paper is not None else '—'} | "
                f"{_ms(c['p99_jct_h'])} | {_ms(c['makespan_h'], 1)} | "
                f"{_ms(c['gpu_hours_per_job'])} | {_ms(c['restarts_per_job'], 1)} | "
                f"{_ms(c['contention_mean'], 1)} | {_ms(c['contention_max'], 0)} | "
                f"{_ms(c['ftf_worst'], 1)} | {_ms(c['unfair_fraction'])} | "
                f"{_ms(c['policy_ms_median'], 1)} | {_ms(c['policy_ms_p95'], 1)} | "
                f"{_ms(c['cpu_seconds'], 0)} |")
        sia = policies.get("sia", {}).get("avg_jct_h")
        ratios = []
        for other in ("pollux", "gavel"):
            o = policies.get(other, {}).get("avg_jct_h")
            papers = PAPER_AVG_JCT_H.get(group, {})
            if sia and o and other in papers:
                ratios.append(f"Sia/{other} avg JCT: {np.mean(sia) / np.mean(o):.2f} "
                              f"(paper {papers['sia'] / papers[other]:.2f})")
        if group in PAPER_SIA_P99_H:
            ratios.append(f"paper's Sia p99 JCT: {PAPER_SIA_P99_H[group]} h")
        lines += ["", "; ".join(ratios), ""]
        lines += _queue_table(group, [r for r in runs if _group(r["workload"]) == group])
    return "\n".join(lines)


QUEUE_FIELDS = ("jobs", "avg_jct_h", "p99_jct_h", "gpu_hours", "guarantee_violation_gpu_h",
                "violation_waiting_gpu_h", "shortfall_gpu_h", "reclaim_s", "reclaim_restarts")


def _queue_table(group: str, runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The group's runs with queues: a row per policy and queue (cells mean ± std over
    the workloads; the violation and the reclaim time: the largest of any run)."""
    cells: dict = defaultdict(lambda: defaultdict(list))  # (policy, queue) -> field -> values
    for run in runs:
        for queue, m in run["metrics"].get("queues", {}).items():
            if m.get("jobs"):
                for f in QUEUE_FIELDS:
                    if m.get(f) is not None:
                        cells[(run["policy"], queue)][f].append(float(m[f]))
    if not cells:
        return []

    def most(values: list[float], digits: int) -> str:
        return f"{max(values):.{digits}f}" if values else "—"

    lines = [f"### Queues, {GROUP_TITLE.get(group, group)}", "",
             "| policy | queue | jobs | avg JCT h | p99 JCT h | GPU h | violation GPU h (max) | "
             "while waiting (max) | shortfall GPU h | reclaim s (max) | gave way |",
             "|" + "---|" * 11]
    for policy, queue in sorted(cells, key=lambda k: (_order(k[0]), k[0])):
        c = cells[(policy, queue)]
        lines.append(
            f"| {policy} | {queue} | {_ms(c['jobs'], 0)} | {_ms(c['avg_jct_h'])} | "
            f"{_ms(c['p99_jct_h'])} | {_ms(c['gpu_hours'], 1)} | "
            f"{most(c['guarantee_violation_gpu_h'], 2)} | "
            f"{most(c['violation_waiting_gpu_h'], 2)} | {_ms(c['shortfall_gpu_h'])} | "
            f"{most(c['reclaim_s'], 0)} | {_ms(c['reclaim_restarts'], 1)} |")
    return [*lines, ""]


# The targets of queues (issue 14; docs/results.md, "Queues"): shared queues beat
# silos (avg JCT <= 0.8x sia-partitioned's with p99 no worse), and cost little (avg
# JCT within +10 % of quota-free Sia).
SILO_RATIO, PRICE = 0.8, 0.10


def queue_targets(runs: Sequence[Mapping[str, Any]],
                  quota_free: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """One row per workload with a run of `sia` with queues: its average and p99 JCT
    beside `sia-partitioned`'s (the same queues) and, from `quota_free` (runs without
    queues), quota-free Sia's; the largest guarantee violation of any of its queues;
    and whether each target holds. [] when no run of `sia` has queues."""
    def by_workload(rs: Sequence[Mapping[str, Any]], policy: str,
                    queued: bool) -> dict[str, Mapping[str, Any]]:
        return {r["workload"]: r["metrics"] for r in rs
                if r["policy"] == policy and bool(r["metrics"].get("queues")) == queued}

    shared, silos = by_workload(runs, "sia", True), by_workload(runs, "sia-partitioned", True)
    free = by_workload(quota_free, "sia", False)
    if not shared:
        return []

    def num(x: float | None, digits: int = 2) -> str:
        return "—" if x is None else f"{x:.{digits}f}"

    def verdict(ok: bool | None) -> str:
        return "—" if ok is None else ("yes" if ok else "**no**")

    def most(m: Mapping[str, Any], field: str) -> float | None:  # over the run's queues
        values = [q[field] for q in m["queues"].values() if q.get(field) is not None]
        return max(values, default=None)

    lines = ["### Queues against the targets", "",
             "| workload | avg JCT h | partitioned | ratio | ≤ 0.8× | quota-free's ratio | "
             "p99 JCT h | partitioned | p99 no worse | quota-free | Δ | ≤ +10 % | "
             "violation GPU h (max) | while waiting (max) |", "|" + "---|" * 14]
    for w, m in sorted(shared.items()):
        part, base = silos.get(w, {}), free.get(w, {})
        avg, p99 = m.get("avg_jct_h"), m.get("p99_jct_h")
        ratio = avg / part["avg_jct_h"] if avg and part.get("avg_jct_h") else None
        # (what sharing at no price at all would reach against the silos)
        ceiling = base["avg_jct_h"] / part["avg_jct_h"] if base.get("avg_jct_h") and \
            part.get("avg_jct_h") else None
        delta = avg / base["avg_jct_h"] - 1 if avg and base.get("avg_jct_h") else None
        worse = None if p99 is None or part.get("p99_jct_h") is None else \
            p99 <= part["p99_jct_h"]
        lines.append(
            f"| {w} | {num(avg)} | {num(part.get('avg_jct_h'))} | {num(ratio)} | "
            f"{verdict(None if ratio is None else ratio <= SILO_RATIO)} | {num(ceiling)} | "
            f"{num(p99)} | "
            f"{num(part.get('p99_jct_h'))} | {verdict(worse)} | {num(base.get('avg_jct_h'))} | "
            f"{'—' if delta is None else f'{100 * delta:+.0f} %'} | "
            f"{verdict(None if delta is None else delta <= PRICE)} | "
            f"{num(most(m, 'guarantee_violation_gpu_h'))} | "
            f"{num(most(m, 'violation_waiting_gpu_h'))} |")
    return [*lines, ""]


def write(json_path: str, out: str | None, command: str = "",
          quota_free: str | None = None) -> int:
    runs = json.loads(Path(json_path).read_text())
    text = markdown(runs, command)
    targets = queue_targets(runs, json.loads(Path(quota_free).read_text()) if quota_free else [])
    if targets:
        text = "\n".join([text, *targets])
    if out:
        Path(out).write_text(text + "\n")
    else:
        print(text)
    return 0
