"""How a person reads the cluster's event history (`pb.Event`): a kind's name, the
`sia events` table, and a job's story (`sia describe`, the dashboard's job page),
for the command line and the dashboard alike."""

from __future__ import annotations

from collections.abc import Iterable

from sia_grpc.api import pb, seconds, state_name
from sia_grpc.api.present import format_age, format_time, table


def kind_name(kind: int) -> str:
    """EVENT_KIND_NODE_LOST → "NodeLost" (kubectl's REASON column spells them so)."""
    try:
        name = pb.EventKind.Name(kind)
    except ValueError:
        return f"Kind{kind}"
    return "".join(w.capitalize() for w in name.removeprefix("EVENT_KIND_").split("_"))


def parse_kind(text: str) -> int:
    """A kind as a person writes it: "NodeLost", "node-lost", "node_lost" or
    "EVENT_KIND_NODE_LOST"; ValueError naming the kinds otherwise."""
    wanted = text.strip().replace("-", "").replace("_", "").lower()
    for value in pb.EventKind.values():
        if value and wanted in (kind_name(value).lower(), "eventkind" + kind_name(value).lower()):
            return value
    known = ", ".join(kind_name(v) for v in pb.EventKind.values() if v)
    raise ValueError(f"unknown event kind {text!r}; the kinds: {known}")


def subject(event: pb.Event) -> str:
    """What the event is about, as kubectl's OBJECT: "job/team-a/train-1",
    "node/rtx-3", "round/12", "queue/research", or "controller"."""
    if event.job_id:
        return f"job/{event.job_id}"
    if event.node:
        return f"node/{event.node}"
    if event.round:
        return f"round/{event.round}"
    if event.queue:
        return f"queue/{event.queue}"
    return "controller"


def events_table(events: Iterable[pb.Event], *, now: float, wide: bool = False) -> str:
    """`sia events`: oldest first, each with its age (and, wide, its id, term and
    time)."""
    rows = []
    for e in events:
        age = format_age(now - seconds(e.time)) if e.HasField("time") else "-"
        row = [age, kind_name(e.kind), subject(e), e.message]
        rows.append([e.id, e.term, format_time(e.time), *row] if wide else row)
    header = ["AGE", "KIND", "OBJECT", "MESSAGE"]
    return table(["ID", "TERM", "TIME", *header] if wide else header, rows)


def job_story(job: pb.Job, events: Iterable[pb.Event]) -> str:
    """`sia describe JOB`: the job as it is, then its events in order, each at its
    offset from the submission (dask's `story()`, for an operator)."""
    st = job.status
    head = [("Job", job.job_id), ("Tenant", job.spec.tenant or "-"),
            ("Queue", job.spec.queue or "default"), ("State", state_name(st.state)),
            ("Reason", st.reason or "-"), ("Submitted", format_time(st.create_time)),
            ("Restarts", str(st.restarts))]
    alloc = st.allocation
    if alloc.gpus:
        nodes = ",".join(dict.fromkeys(g.node for g in alloc.gpus))
        head.append(("Allocation", f"{alloc.num_gpus} {alloc.gpu_type} on {nodes}, batch "
                                   f"{alloc.batch_size}"))
    width = max(len(k) for k, _ in head) + 1
    lines = [f"{k + ':':<{width}} {v}" for k, v in head]
    start = seconds(st.create_time)
    rows = [[f"+{format_age(seconds(e.time) - start)}" if start else format_time(e.time),
             kind_name(e.kind), e.message] for e in events]
    lines += ["", "Events:", table(["AT", "KIND", "WHAT"], rows) if rows else "  (none kept)"]
    return "\n".join(lines)
