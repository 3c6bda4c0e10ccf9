"""Job-arrival traces.

A trace is a CSV file with a header row and one job per row:

    name, time, application, num_replicas, batch_size[, category][, queue][, priority]

`time` is the submission time in seconds from the start (a non-negative number);
`application` one of `sia_grpc.models.profiles.APPLICATIONS`; `num_replicas` and
`batch_size` the job's hand-tuned rigid configuration (positive integers), which
rigid and strong-scaling jobs run with and rigid schedulers give every job;
`category` (optional; empty or absent: adaptive) one of `adaptive`, `rigid`,
`strong-scaling` (also spelt `strong_scaling` or `strong`; any case). Columns may
come in any order; other columns are ignored. Names must be unique.
`queue` and `priority` (optional; empty or absent: none named) are the job's queue
and priority class (`sia_grpc.policy.queues`); `sia simulate --queues` checks them
against the queues file (`load_workload(..., queues=)`) and gives a job that names no
queue one by the file's assignment rule (`sia_grpc.policy.queues.files`).

The artifact's traces ship in the package (`sia_grpc/data/artifact/workloads/`)
and are named by their path there without `.csv`: `philly/workload-1`,
`saturn/workload-3`, `newtrace/workload-5`, `scale/rate_30/workload-2`, ...
None of them has a `category` column: all their jobs are adaptive.
"""

from __future__ import annotations

import csv
import enum
import io
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sia_grpc.models.profiles import APPLICATIONS
from sia_grpc.names import MAX_ID, is_name
from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.queues import QueueSet

__all__ = ["Category", "TraceJob", "WorkloadError", "load_workload", "shipped_workloads",
           "workload_csv"]


class Category(enum.Enum):
    ADAPTIVE = "adaptive"  # the scheduler picks GPU type, count and batch size
    RIGID = "rigid"  # fixed GPU count and batch size; only the type is chosen
    STRONG_SCALING = "strong-scaling"  # fixed batch size; type and count chosen


_CATEGORY_SPELLINGS = {
    "": Category.ADAPTIVE,
    "adaptive": Category.ADAPTIVE,
    "rigid": Category.RIGID,
    "strong-scaling": Category.STRONG_SCALING,
    "strong_scaling": Category.STRONG_SCALING,
    "strong": Category.STRONG_SCALING,
}


@dataclass(frozen=True)
class TraceJob:
    name: str
    time: float  # submission, s from the start of the trace
    application: str
    num_replicas: int  # the hand-tuned rigid GPU count
    batch_size: int  # the hand-tuned (global) batch size
    category: Category = Category.ADAPTIVE
    queue: str = ""  # "": none named (the assignment rule's, or the default queue)
    priority: str = ""  # "": the queues' default priority class


class WorkloadError(ValueError):
    """A malformed trace; the message names the file, line and field."""


_REQUIRED = ("name", "time", "application", "num_replicas", "batch_size")
_OPTIONAL = ("category", "queue", "priority")


def _root():
    return resources.files("sia_grpc").joinpath("data", "artifact", "workloads")


def _natural(s: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))


def shipped_workloads(group: str | None = None) -> tuple[str, ...]:
    """Names of the shipped traces, e.g. `("newtrace/workload-1", ...,
    "saturn/workload-5", "scale/rate_10/workload-1", ...)`; with `group`
    (`"philly"`, `"scale"`, `"scale/rate_30"`, ...) only those under it."""
    names: list[str] = []

    def walk(node, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(".csv"):
                names.append(prefix + child.name[: -len(".csv")])

    walk(_root(), "")
    if group is not None:
        prefix = group.strip("/") + "/"
        names = [n for n in names if n.startswith(prefix)]
        if not names:
            groups = sorted({n.rsplit("/", 1)[0] for n in shipped_workloads()}, key=_natural)
            raise ValueError(f"group: no shipped workloads under {group!r}; "
                             f"groups: {', '.join(groups)}")
    return tuple(sorted(names, key=_natural))


def _read(path_or_name: str | os.PathLike[str]) -> tuple[str, str]:
    """(text, name for messages) of a CSV file on disk or a shipped trace."""
    path = Path(path_or_name)
    if path.is_file():
        return path.read_text(encoding="utf-8"), str(path_or_name)
    name = str(path_or_name).strip("/")
    name = name[: -len(".csv")] if name.endswith(".csv") else name
    parts = name.split("/")
    if name and ".." not in parts:
        res = _root().joinpath(*parts[:-1], parts[-1] + ".csv")
        if res.is_file():
            return res.read_text(encoding="utf-8"), name + ".csv"
    groups = sorted({n.rsplit("/", 1)[0] for n in shipped_workloads()}, key=_natural)
    raise WorkloadError(f"{path_or_name}: no such file or shipped workload (shipped: "
                        f"<group>/workload-<k> for group {', '.join(groups)})")


def _number(where: str, field: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise WorkloadError(f"{where}: {field}: not a number: {value!r}") from None
    if not math.isfinite(x):
        raise WorkloadError(f"{where}: {field}: not a finite number: {value!r}")
    return x


def _positive_int(where: str, field: str, value: str) -> int:
    x = _number(where, field, value)
    if x != int(x):
        raise WorkloadError(f"{where}: {field}: not an integer: {value!r}")
    if x <= 0:
        raise WorkloadError(f"{where}: {field}: must be positive, got {value!r}")
    return int(x)


def _queue_name(where: str, field: str, value: str, queues: QueueSet | None) -> str:
    """A `queue` or `priority` cell: "" or a name, and with `queues` one they define."""
    if value and not is_name(value, MAX_ID):
        raise WorkloadError(f"{where}: {field}: {value!r} is not a valid name")
    if value and queues is not None:
        try:
            (queues.queue if field == "queue" else queues.priority)(value)
        except FieldError as err:
            raise WorkloadError(f"{where}: {field}: {err.problem}") from None
    return value


def load_workload(path_or_name: str | os.PathLike[str],
                  queues: QueueSet | None = None) -> tuple[TraceJob, ...]:
    """The jobs of a trace, sorted by (time, name): a CSV file, or a shipped trace's
    name such as `"saturn/workload-1"`. Raises WorkloadError naming file, line
    and field for anything malformed; with `queues`, also for a queue or priority
    class they do not define."""
    text, src = _read(path_or_name)
    reader = csv.reader(io.StringIO(text))
    header = next(([cell.strip() for cell in row] for row in reader
                   if any(cell.strip() for cell in row)), None)
    if header is None:
        raise WorkloadError(f"{src}: empty file (no header)")
    index = _columns(header, f"{src} line {reader.line_num}")
    jobs: list[TraceJob] = []
    first_line: dict[str, int] = {}
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue
        line = reader.line_num
        where = f"{src} line {line}"
        if len(row) != len(header):
            raise WorkloadError(f"{where}: expected {len(header)} fields, got {len(row)}")
        job = _job(where, {c: row[i].strip() for c, i in index.items()}, first_line, queues)
        first_line[job.name] = line
        jobs.append(job)
    if not jobs:
        raise WorkloadError(f"{src}: no jobs")
    return tuple(sorted(jobs, key=lambda j: (j.time, j.name)))


def _columns(header: list[str], where: str) -> dict[str, int]:
    """The index of each known column of `header`; WorkloadError for a duplicate
    column or a required one missing."""
    seen: set[str] = set()
    for col in header:
        if col in seen:
            raise WorkloadError(f"{where}: header: duplicate column {col!r}")
        seen.add(col)
    missing = [c for c in _REQUIRED if c not in seen]
    if missing:
        raise WorkloadError(f"{where}: header: missing column(s) "
                            f"{', '.join(map(repr, missing))} (have {', '.join(header)})")
    return {c: header.index(c) for c in (*_REQUIRED, *_OPTIONAL) if c in seen}


def _job(where: str, cell: dict[str, str], first_line: dict[str, int],
         queues: QueueSet | None) -> TraceJob:
    """One row's job from its stripped cells by column; `first_line`: the line of
    every name read so far (a name may not repeat)."""
    name = cell["name"]
    if not name:
        raise WorkloadError(f"{where}: name: empty")
    if name in first_line:
        raise WorkloadError(f"{where}: name: duplicate {name!r} "
                            f"(first on line {first_line[name]})")
    time = _number(where, "time", cell["time"])
    if time < 0:
        raise WorkloadError(f"{where}: time: must be non-negative, got {cell['time']!r}")
    app = cell["application"]
    if app not in APPLICATIONS:
        raise WorkloadError(f"{where}: application: unknown {app!r} "
                            f"(known: {', '.join(APPLICATIONS)})")
    replicas = _positive_int(where, "num_replicas", cell["num_replicas"])
    batch = _positive_int(where, "batch_size", cell["batch_size"])
    raw = cell.get("category", "")
    category = _CATEGORY_SPELLINGS.get(raw.lower())
    if category is None:
        raise WorkloadError(f"{where}: category: unknown {raw!r} "
                            f"(use adaptive, rigid or strong-scaling)")
    queue = _queue_name(where, "queue", cell.get("queue", ""), queues)
    priority = _queue_name(where, "priority", cell.get("priority", ""), queues)
    return TraceJob(name=name, time=time, application=app, num_replicas=replicas,
                    batch_size=batch, category=category, queue=queue, priority=priority)


def workload_csv(jobs: Sequence[TraceJob]) -> str:
    """`jobs` as a trace CSV that `load_workload` reads back to the same jobs (every
    column, the optional ones included)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*_REQUIRED, *_OPTIONAL])
    for j in jobs:
        writer.writerow([j.name, repr(float(j.time)).removesuffix(".0"), j.application,
                         j.num_replicas, j.batch_size, j.category.value, j.queue, j.priority])
    return out.getvalue()
