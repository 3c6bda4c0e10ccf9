"""`sia simulate`: run workloads under policies, in parallel processes, with
progress on stderr and a table (and optional JSON and plots) at the end."""

from __future__ import annotations

import dataclasses
import itertools
import json
import multiprocessing
import queue
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

from sia_grpc.policy import SettingError, make_policy
from sia_grpc.policy import params as policy_params
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.queues.files import assign, read_queues
from sia_grpc.sim.clusters import load_cluster
from sia_grpc.sim.engine import SimConfig, simulate
from sia_grpc.sim.progress import Display, Reporter, Sink, Update, make_display
from sia_grpc.sim.records import SimResult, round_length
from sia_grpc.sim.workload import TraceJob, load_workload, shipped_workloads


def resolve_workloads(items: Sequence[str]) -> list[str]:
    """CSV paths, directories of CSVs, shipped names ("saturn/workload-1") or
    shipped groups ("saturn") → a list of workload references."""
    out: list[str] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(str(p) for p in path.glob("*.csv"))
            if not found:
                raise ValueError(f"workload: no .csv files in directory {item!r}")
            out.extend(found)
        elif path.is_file():
            out.append(str(path))
        elif item in shipped_workloads():
            out.append(item)
        else:
            try:
                out.extend(shipped_workloads(item))
            except ValueError:
                raise ValueError(f"workload: {item!r} is not a file, a directory, or a "
                                 f"shipped workload (e.g. saturn, saturn/workload-1)") from None
    return out


@dataclass(frozen=True)
class Variant:
    """One policy with one set of settings: what a run uses, and its label."""

    policy: str
    params: Mapping[str, object]  # normalized: config field -> value

    @property
    def label(self) -> str:
        return policy_params.label(self.policy, self.params)


def read_policy_config(path: str | None) -> dict[str, dict[str, object]]:
    """`--policy-config FILE`: `[policy.<name>]` tables, as in the controller's TOML."""
    if path is None:
        return {}
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    for key in data:
        if key != "policy":
            raise ValueError(f"{path}: {key}: unknown table; this file holds "
                             "[policy.<name>] tables only")
    table = data.get("policy", {})
    if isinstance(table, Mapping) and "name" in table:
        raise ValueError(f"{path}: policy.name: sia simulate runs the policies --policy "
                         "names")
    try:
        return policy_params.from_toml(table)
    except SettingError as err:
        raise ValueError(f"{path}: {err}") from None


def variants(policies: Sequence[str], file_params: Mapping[str, Mapping[str, object]],
             sets: Sequence[str]) -> list[Variant]:
    """Each policy with the file's settings, then each `--set POLICY.SETTING=VALUE`
    over them; `VALUE1,VALUE2,...` runs one variant per value (several such: every
    combination). A `--set` for a policy not in `policies` is an error."""
    fixed = {p: dict(file_params.get(p, {})) for p in policies}
    swept: dict[str, dict[str, list[object]]] = {p: {} for p in policies}
    for text in sets:
        try:
            name, setting, raw = policy_params.assignment(text)
            if name not in fixed:
                raise SettingError(setting, f"{name} is not among --policy "
                                            f"({', '.join(policies)})", name)
            choices = [policy_params.normalize(name, {setting: v}) for v in raw.split(",")]
        except SettingError as err:
            raise ValueError(f"--set {err}") from None
        field = next(iter(choices[0]))
        values = list(dict.fromkeys(c[field] for c in choices))
        fixed[name].pop(field, None)
        swept[name].pop(field, None)
        if len(values) == 1:
            fixed[name][field] = values[0]
        else:
            swept[name][field] = values
    out: dict[str, Variant] = {}
    for p in policies:
        for combo in itertools.product(*swept[p].values()):
            v = Variant(p, {**fixed[p], **dict(zip(swept[p], combo, strict=True))})
            out.setdefault(v.label, v)
    return list(out.values())


def load_trace(workload: str, queues: str | None) -> tuple[tuple[TraceJob, ...],
                                                          QueueSet | None]:
    """The workload's jobs and, with a queues file, the queues, each job in its queue
    (its own, checked against the file, or the file's assignment rule's)."""
    if queues is None:
        return load_workload(workload), None
    file = read_queues(queues)
    return assign(load_workload(workload, file.queues), file), file.queues


def run_one(workload: str, variant: Variant, cluster: str, scale: int,
            round_duration: float | None = None, queues: str | None = None, *,
            on_progress: Callable[[int, int, float], None] | None = None) -> SimResult:
    """One simulation; `round_duration` None: the policy's own round length;
    `queues`: the path of a queues file (`policy.queues.files`), None: no queues;
    `on_progress`: as `simulate`'s."""
    policy = make_policy(variant.policy, variant.params, round_duration=round_duration)
    trace, queue_set = load_trace(workload, queues)
    result = simulate(trace, load_cluster(cluster, scale=scale), policy,
                      workload_name=workload, cluster_name=f"{cluster}x{scale}",
                      config=SimConfig(), queues=queue_set, on_progress=on_progress)
    return dataclasses.replace(result, policy=variant.label, params=dict(variant.params),
                               settings=policy_params.current(policy))


def _run_reported(sink: Sink | None, key: int, workload: str, variant: Variant,
                  cluster: str, scale: int, round_duration: float | None,
                  queues: str | None) -> SimResult:
    """`run_one` in a worker process, its progress (rate-limited) to `sink`."""
    reporter = None if sink is None else Reporter(sink, key)
    return run_one(workload, variant, cluster, scale, round_duration, queues,
                   on_progress=reporter)


def _drain(sink: queue.Queue | None, display: Display) -> None:
    """Show every update the workers have queued."""
    while sink is not None:
        try:
            item = sink.get_nowait()
        except queue.Empty:
            return
        if isinstance(item, Update):
            display.update(item)


def run(workloads: Sequence[str], policies: Sequence[str], cluster: str, scale: int,
        processes: int, json_out: str | None, plots: str | None, *,
        policy_config: str | None = None, sets: Sequence[str] = (),
        round_duration: float | None = None, queues: str | None = None,
        quiet: bool = False) -> int:
    """`sia simulate`. Progress on stderr (sia_grpc.sim.progress: bars on a terminal,
    else a line per run at most every 30 s, and a line as each run ends); `quiet`:
    none, only the table."""
    from sia_grpc.sim import metrics

    refs = resolve_workloads(workloads)
    for p in policies:
        policy_params.policy_class(p)  # "policy: unknown 'x'; choose one of ..."
    runs = variants(policies, read_policy_config(policy_config), sets)
    _check_before_running(refs, runs, cluster, scale, round_duration, queues, json_out)
    labels = [v.label for v in runs]
    tasks = [(w, v) for v in runs for w in refs]
    results = _run_all(tasks, cluster, scale, processes, round_duration, queues, quiet=quiet)
    _print_tables(results, labels, refs, with_queues=queues is not None)
    if json_out:
        payload = [metrics.to_json(results[(w, v.label)], metrics.compute(results[(w, v.label)]))
                   for w, v in tasks]
        Path(json_out).write_text(json.dumps(payload, indent=2, default=_plain))
    if plots:
        from sia_grpc.sim import plots as plotting

        by_policy = {p: [results[(w, p)] for w in refs] for p in labels}
        for path in plotting.write_all(by_policy, plots):
            if not quiet:
                print(f"wrote {path}", file=sys.stderr)
    return 0


def _check_before_running(refs: Sequence[str], runs: Sequence[Variant], cluster: str,
                          scale: int, round_duration: float | None, queues: str | None,
                          json_out: str | None) -> None:
    """Every error that the arguments make, said now rather than after hours of
    simulating: a bad round length or combination of settings, cluster, queues file,
    a trace naming an unknown queue, or a JSON path in no directory."""
    for v in runs:
        try:
            make_policy(v.policy, v.params, round_duration=round_duration)
        except SettingError as err:
            if err.setting == "round_duration" and not err.policy:
                raise ValueError(f"--round-duration: {err.problem}") from None
            raise ValueError(f"--set {err}") from None
    load_cluster(cluster, scale=scale)
    if queues is not None:
        for w in refs:
            load_trace(w, queues)
    if json_out and not Path(json_out).parent.is_dir():
        raise ValueError(f"--json {json_out}: no directory {str(Path(json_out).parent)!r}")


def _run_all(tasks: Sequence[tuple[str, Variant]], cluster: str, scale: int, processes: int,
             round_duration: float | None, queues: str | None, *,
             quiet: bool) -> dict[tuple[str, str], SimResult]:
    """Every (workload, variant) of `tasks` in `processes` worker processes, their
    progress shown on stderr; the results by (workload, variant label)."""
    results: dict[tuple[str, str], SimResult] = {}
    ctx = multiprocessing.get_context("spawn")
    display = make_display(sys.stderr, len(tasks), quiet=quiet)
    manager = None if quiet else ctx.Manager()
    try:
        sink = None if manager is None else manager.Queue()
        with ProcessPoolExecutor(max_workers=max(1, processes), mp_context=ctx) as pool:
            futures: dict[Future[SimResult], tuple[int, str, str]] = {}
            for key, (w, v) in enumerate(tasks):
                display.start(key, f"{v.label} on {w}")
                fut = pool.submit(_run_reported, sink, key, w, v, cluster, scale,
                                  round_duration, queues)
                futures[fut] = (key, w, v.label)
            pending, done = set(futures), 0
            while pending:
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(sink, display)
                for fut in finished:
                    key, w, p = futures[fut]
                    r = results[(w, p)] = fut.result()
                    done += 1
                    display.finish(key, f"[{done}/{len(tasks)}] {p} on {w}: "
                                        f"{len(r.rounds)} rounds, {r.cpu_seconds:.1f} CPU-s")
    finally:
        display.close()
        if manager is not None:
            manager.shutdown()
    return results


def _print_tables(results: Mapping[tuple[str, str], SimResult], labels: Sequence[str],
                  refs: Sequence[str], *, with_queues: bool) -> None:
    """The metrics table (a row per run, and per policy their mean ± std over several
    workloads) and, for runs with queues, the per-queue table."""
    from sia_grpc.policy.queues.measures import compute_queues
    from sia_grpc.sim import metrics

    table_rows: dict[str, object] = {}
    per_policy: dict[str, list] = {p: [] for p in labels}
    for p in labels:
        for w in refs:
            m = metrics.compute(results[(w, p)])
            per_policy[p].append(m)
            table_rows[f"{p} {w}"] = m
        if len(refs) > 1:
            table_rows[f"{p} (mean ± std)"] = metrics.summarize(per_policy[p])
    print(metrics.format_table(table_rows))
    if with_queues:
        queue_rows = {f"{p} {w} {q}": m for p in labels for w in refs
                      for q, m in compute_queues(results[(w, p)],
                                                 round_length(results[(w, p)])).items() if m.jobs}
        print("\nPer queue (docs/results.md, \"What the columns mean\"):")
        print(metrics.format_table(queue_rows, columns=metrics.QUEUE_COLUMNS))


def _plain(obj):
    try:
        return asdict(obj)
    except TypeError:
        return str(obj)
