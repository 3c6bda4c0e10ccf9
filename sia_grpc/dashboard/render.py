"""The dashboard's pages as HTML, drawn on the server: pure functions of the `Model`
and the time. Here the frame every page shares and the cluster, jobs, rounds and
queues pages; one job's page is `job_page`'s, the inline SVG charts `charts`'s. The
browser's script (static/dashboard.js) swaps in the fragments the server pushes
(`job_row`, `cluster_section`, `round_row`, `queues_section`) as events arrive."""

from __future__ import annotations

from html import escape
from typing import Any

from sia_grpc.api import OTHER_TENANT, node_state_name, pb, seconds, state_name
from sia_grpc.api.present import (
    QueueUse,
    format_gpus,
    job_age,
    job_reason,
    queue_columns,
    queue_uses,
)
from sia_grpc.dashboard.charts import panel_row, step_chart, use_chart
from sia_grpc.dashboard.model import UNITS, JobRecord, Model
from sia_grpc.dashboard.style import job_colour, job_href, type_colours, utc

MOVES_SHOWN = 20  # the jobs listed under a round (then "and N more")
PAGES = [("/", "Cluster"), ("/jobs", "Jobs"), ("/rounds", "Rounds"), ("/queues", "Queues")]


# -- the frame ---------------------------------------------------------------------------


def page(title: str, body: str, *, active: str, model: Model, controller: str,
         job: str = "") -> str:
    """A whole page: the navigation, the upstream's state, `body`."""
    nav = "".join(f'<a href="{href}"{" class=active" if href == active else ""}>{name}</a>'
                  for href, name in PAGES)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · sia dashboard</title>
<link rel="stylesheet" href="/static/dashboard.css">
<script src="/static/dashboard.js" defer></script>
</head><body data-page="{escape(active)}" data-job="{escape(job)}">
<header><span class="brand">sia</span><nav>{nav}</nav>
<span class="controller">controller {escape(controller)}</span>
{upstream_badge(model.upstream)}</header>
<main>{body}</main>
</body></html>"""


def upstream_badge(upstream: str) -> str:
    """The dashboard's connection to the controller: "live", or why not."""
    state = "live" if upstream == "live" else "down"
    return (f'<span id="upstream" class="upstream {state}" '
            f'title="the dashboard\'s connection to the controller">{escape(upstream)}</span>')


def not_found(what: str) -> str:
    return f'<h1>Not found</h1><p class="empty">{escape(what)}</p>'


# -- cluster -----------------------------------------------------------------------------


def cluster_page(model: Model, now: float) -> str:
    return ('<h1>Cluster</h1><p class="hint">Each cell is a GPU, coloured by the job '
            'holding it (its name inside; hover for the id). Updated as rounds run.</p>'
            + cluster_section(model, now))


def cluster_section(model: Model, now: float) -> str:
    """Every node a row of GPU cells, grouped by GPU type, with each type's totals;
    then the panels over time."""
    c = model.cluster
    names = {rec.job.job_id: rec.job.spec.name for rec in model.jobs.values()}
    if not c.nodes:
        return '<section id="cluster"><p class="empty">no nodes registered yet</p></section>'
    parts = [f'<section id="cluster"><p class="policy">policy <b>{escape(c.policy or "-")}'
             f'</b> · round {c.round_duration_s:g} s</p>']
    for t in c.types:
        nodes = [n for n in c.nodes if n.gpu_type == t.gpu_type]
        free = t.gpus - t.allocated
        rows = "".join(_node_row(n, names) for n in nodes)
        parts.append(
            f'<div class="gputype" data-type="{escape(t.gpu_type)}" data-gpus="{t.gpus}" '
            f'data-allocated="{t.allocated}"><h2>{escape(t.gpu_type)} <span class="totals">'
            f'{t.nodes} node{"s" * (t.nodes != 1)} · {t.gpus} GPUs · '
            f'<b class="allocated">{t.allocated}</b> allocated · <b class="free">{free}</b> '
            f'free</span></h2>{_meter(t.allocated, t.gpus)}'
            f'<table class="nodes">{rows}</table></div>')
    parts.append(over_time(model, now))
    parts.append("</section>")
    return "".join(parts)


def _meter(used: int, total: int) -> str:
    share = 100 * used / total if total else 0
    return (f'<div class="meter" role="img" aria-label="{used} of {total} allocated">'
            f'<div style="width:{share:.1f}%"></div></div>')


def _node_row(n: pb.Node, names: dict[str, str]) -> str:
    state = node_state_name(n.state).lower()
    badge = "" if n.state == pb.NODE_STATE_READY else (
        f'<span class="badge {state}">{escape(state.upper())}'
        f'{": " + escape(n.drain_reason) if n.drain_reason else ""}</span>')
    cells = "".join(_gpu_cell(n, slot, names) for slot in n.gpus)
    level = n.isolation or "unknown"
    iso = (f'<span class="isolation {escape(level)}" title="how this node\'s agent '
           f'separates jobs (docs/agent.md, Isolation)">{escape(level)}</span>')
    return (f'<tr class="node {state}" data-node="{escape(n.name)}" data-state="{state}" '
            f'data-isolation="{escape(level)}"><th>{escape(n.name)}{badge}{iso}</th>'
            f'<td class="cells">{cells}</td></tr>')


def _gpu_cell(n: pb.Node, slot: pb.GpuSlot, names: dict[str, str]) -> str:
    where = f"{n.name} GPU {slot.index}"
    if not slot.job_id:
        return f'<span class="gpu free" data-job="" title="{escape(where)}: free"></span>'
    if slot.job_id == OTHER_TENANT:
        return (f'<span class="gpu other" data-job="{escape(OTHER_TENANT)}" '
                f'title="{escape(where)}: another tenant\'s job">other</span>')
    bg, fg = job_colour(slot.job_id)
    label = names.get(slot.job_id) or slot.job_id
    return (f'<a class="gpu held" data-job="{escape(slot.job_id)}" '
            f'href="{job_href(slot.job_id)}" style="background:{bg};color:{fg}" '
            f'title="{escape(where)}: {escape(slot.job_id)} ({escape(label)})">'
            f'{escape(label)}</a>')


def over_time(model: Model, now: float) -> str:
    """One panel per GPU type (allocated against its capacity), and the jobs waiting
    and running."""
    colours = type_colours(t.gpu_type for t in model.cluster.types)
    panels = [(f"{t.gpu_type}: GPUs allocated of {t.gpus}", step_chart(
        model.allocated.get(t.gpu_type, []), now, colours, capacity=t.gpus,
        label=f"{t.gpu_type} GPUs allocated over time", width=380, height=130))
        for t in model.cluster.types]
    for name, what, colour in (("waiting", "queued or profiling", "#CC79A7"),
                               ("running", "running or restarting", "#0072B2")):
        panels.append((f"jobs {name} ({what})", step_chart(
            model.jobs_by[name], now, {name: colour}, label=f"jobs {name} over time",
            width=380, height=130)))
    return ('<h2>Over time</h2><p class="hint">As this dashboard saw it since it started.'
            '</p>' + panel_row(panels))


# -- jobs --------------------------------------------------------------------------------

# (header, the cell's text, the value it sorts by)
_COLUMNS: list[tuple[str, Any]] = [
    ("ID", lambda j, now: (j.job_id, j.job_id)),
    ("NAME", lambda j, now: (j.spec.name or "-", j.spec.name)),
    ("STATE", lambda j, now: (state_name(j.status.state), state_name(j.status.state))),
    ("QUEUE", lambda j, now: (j.spec.queue or "default", j.spec.queue or "default")),
    ("TENANT", lambda j, now: (j.spec.tenant or "-", j.spec.tenant)),
    ("GPUS", lambda j, now: (format_gpus(j), j.status.allocation.num_gpus)),
    ("BATCH", lambda j, now: (j.status.allocation.batch_size or "-",
                              j.status.allocation.batch_size)),
    ("PROGRESS", lambda j, now: (f"{j.status.progress * 100:.0f}%", j.status.progress)),
    ("RESTARTS", lambda j, now: (j.status.restarts, j.status.restarts)),
    ("AGE", lambda j, now: (job_age(j, now), -seconds(j.status.create_time))),
    ("REASON", lambda j, now: (job_reason(j), job_reason(j))),
]


def jobs_page(model: Model, now: float) -> str:
    rows = "".join(job_row(rec, now) for rec in sorted(
        model.jobs.values(), key=lambda r: (-seconds(r.job.status.create_time), r.job.job_id)))
    states = "".join(f'<option value="{s}">{s.lower()}</option>'
                     for s in (state_name(v) for v in pb.JobState.values()[1:]))
    head = "".join(f'<th data-col="{i}" tabindex="0" aria-sort="none">{name}</th>'
                   for i, (name, _) in enumerate(_COLUMNS))
    return f"""<h1>Jobs <span class="count" id="job-count">{len(model.jobs)}</span></h1>
<div class="filters"><input id="filter" type="search" aria-label="filter jobs"
placeholder="filter: id, name, tenant, queue, reason…"><select id="state-filter" aria-label="state">
<option value="">every state</option><option value="ACTIVE">not finished</option>{states}
</select></div>
<table id="jobs" class="jobs"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>
<p class="empty" id="no-jobs"{" hidden" if model.jobs else ""}>no jobs</p>"""


def job_row(rec: JobRecord, now: float) -> str:
    """One row of the jobs table; `data-created` lets the browser keep AGE current."""
    j = rec.job
    cells = []
    for name, cell in _COLUMNS:
        text, key = cell(j, now)
        text = escape(str(text))
        if name == "ID":
            text = f'<a href="{job_href(j.job_id)}">{text}</a>'
        cls = f' class="{name.lower()}"'
        cells.append(f'<td{cls} data-sort="{escape(str(key))}">{text}</td>')
    state = state_name(j.status.state)
    return (f'<tr data-job="{escape(j.job_id)}" data-state="{state}" '
            f'data-created="{seconds(j.status.create_time):.0f}">{"".join(cells)}</tr>')


# -- rounds ------------------------------------------------------------------------------

_ROUND_HEAD = ["ROUND", "START", "TRIGGER", "JOBS", "GPUS", "MOVED", "RECLAIMS",
               "ESTIMATE MS", "SOLVE MS", "PLACE MS", "DISPATCH MS", "TOTAL MS", "NOTE"]


def rounds_page(model: Model) -> str:
    rows = "".join(round_row(r) for r in reversed(model.rounds))
    head = "".join(f"<th>{h}</th>" for h in _ROUND_HEAD)
    return f"""<h1>Rounds</h1><p class="hint">The last {len(model.rounds)} scheduling rounds,
newest first, with the time each phase took, and under each the jobs it started, moved,
resized or preempted, from the GPUs they held to those it gave them.</p>
<table id="rounds" class="rounds"><thead><tr>{head}</tr></thead>{rows}</table>
<p class="empty" id="no-rounds"{" hidden" if model.rounds else ""}>no rounds yet</p>"""


def round_row(r: pb.Round) -> str:
    """A round's rows (one `tbody`): its numbers, then the jobs whose GPUs it changed."""
    cells = [r.round or "-", utc(seconds(r.start_time)), r.trigger or "-", r.jobs,
             r.gpus_allocated, r.jobs_moved, r.reclaims, f"{r.estimate_ms:.1f}",
             f"{r.solve_ms:.1f}", f"{r.place_ms:.1f}", f"{r.dispatch_ms:.1f}",
             f"{r.total_ms:.1f}", r.note]
    row = "".join(f"<td>{escape(str(c))}</td>" for c in cells)
    shown = r.moves[:MOVES_SHOWN]
    moves = "".join(_move_item(m) for m in shown)
    if (rest := max(r.jobs_moved, len(r.moves)) - len(shown)) > 0:  # (the round lists 20)
        moves += f'<li class="more">and {rest} more</li>'
    more = (f'<tr class="moves"><td></td><td colspan="{len(cells) - 1}"><ul class="moves">'
            f'{moves}</ul></td></tr>' if moves else "")
    return (f'<tbody class="round" data-round="{r.round}"><tr class="round">{row}</tr>'
            f'{more}</tbody>')


def _move_item(m: pb.RoundMove) -> str:
    """One job a round changed: what it did, the job (a link to its page), from what
    to what."""
    if m.job_id == OTHER_TENANT:
        job = '<span class="other">another tenant\'s job</span>'
    else:
        job = (f'<a href="{job_href(m.job_id)}" title="{escape(m.job_id)}">'
               f'{escape(m.name or m.job_id)}</a>')
    before = allocation_text(m.before) if m.HasField("before") else "-"
    after = allocation_text(m.after) if m.HasField("after") else "queued"
    return (f'<li class="move" data-job="{escape(m.job_id)}" data-kind="{escape(m.kind)}">'
            f'<b class="kind {escape(m.kind)}">{escape(m.kind or "-")}</b> {job} '
            f'<span class="from">{escape(before)}</span> → '
            f'<span class="to">{escape(after)}</span></li>')


def allocation_text(a: pb.Allocation) -> str:
    """"2 rtx on rtx-0", "4 aws on aws-0,aws-1"; "-" for none."""
    if not a.num_gpus:
        return "-"
    nodes = ",".join(sorted({g.node for g in a.gpus}))
    return f"{a.num_gpus} {a.gpu_type}" + (f" on {nodes}" if nodes else "")


# -- queues ------------------------------------------------------------------------------


def queues_page(model: Model, now: float) -> str:
    return ('<h1>Queues</h1><p class="hint">What each queue holds against its guarantee '
            '(the bar: held; the mark: guaranteed), by GPU type.</p>'
            + queues_section(model, now))


def queues_section(model: Model, now: float) -> str:
    """The queues table (`present.queue_columns`: the columns `sia queues` shows), each
    row with its use bars (`present.queue_uses`), then the panels over time."""
    if not model.queues.queues:
        return '<section id="queues"><p class="empty">no queues</p></section>'
    columns = queue_columns(model.queues)
    rows = []
    for q in model.queues.queues:
        cells = "".join(f"<th>{escape(str(cell(q)))}</th>" if name == "QUEUE"
                        else f"<td>{escape(str(cell(q)))}</td>" for name, cell in columns)
        bars = "".join(_use_bar(use) for use in queue_uses(q))
        rows.append(f'<tr data-queue="{escape(q.spec.name)}">{cells}'
                    f'<td class="bars">{bars or "-"}</td></tr>')
    head = "".join(f"<th>{name}</th>" for name, _ in columns)
    return (f'<section id="queues"><table class="queues"><thead><tr>{head}<th>USE</th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table>'
            f'{queues_over_time(model, now)}</section>')


def queues_over_time(model: Model, now: float) -> str:
    """Per queue, under its name: per GPU type (and in units, for a type-flexible
    guarantee) what it held against its guarantee, and its jobs pending."""
    colours = type_colours(t.gpu_type for t in model.cluster.types)
    parts = []
    for q in model.queues.queues:
        name = q.spec.name
        hist = model.queue_use.get(name)
        if hist is None:
            continue
        panels = []
        for key in sorted(hist.use, key=lambda k: (k == UNITS, k)):
            series, unit = hist.use[key], "units" if key == UNITS else "GPUs"
            last = series[-1]
            what = "units (type-flexible guarantee)" if key == UNITS else f"{key} GPUs"
            # (A type the queue has no guarantee of: no "of 0 guaranteed".)
            of = f" of {last.guarantee:g} guaranteed" if last.guarantee or key == UNITS else ""
            panels.append((f"{what}: {last.held:g} held{of}"
                           + (f", {last.borrowed:g} borrowed" if last.borrowed else ""),
                           use_chart(series, now, colours.get(key, "#009E73"), unit=unit,
                                     label=f"queue {name}: {what} held over time")))
        panels.append((f"jobs pending: {q.pending_jobs}", step_chart(
            hist.pending, now, {"pending": "#CC79A7"}, label=f"queue {name}: jobs pending "
            "over time", width=300, height=120)))
        parts.append(f'<div class="queue-use" data-queue="{escape(name)}"><h3>queue '
                     f'{escape(name)}</h3>{panel_row(panels)}</div>')
    if not parts:
        return ""
    return ('<h2>Over time</h2><p class="hint">As this dashboard saw it since it started: '
            'the bars what each queue held (hatched: borrowed, beyond its guarantee), the '
            'dashed line its guarantee.</p>' + "".join(parts))


def _use_bar(use: QueueUse) -> str:
    """One bar of a queue's use: what it holds of a GPU type (or in units) against its
    guarantee (the mark; none where it has none of that), marked `over` only where the
    controller counts some of it borrowed."""
    guarantee = use.guarantee or 0
    scale = max(use.held, guarantee, 1)
    over = " over" if use.borrowed else ""
    what = "units (any type)" if use.key == UNITS else use.key
    title = (f"{what}: {use.held:g} held, " + (f"{guarantee:g} guaranteed" if use.guarantee
                                                is not None else "no guarantee of the type")
             + (f", {use.borrowed:g} borrowed" if use.borrowed else ""))
    mark = (f'<span class="mark" style="left:{100 * guarantee / scale:.0f}%"></span>'
            if use.guarantee is not None else "")
    return (f'<div class="use{over}" title="{escape(title)}"><span class="t">'
            f'{escape(use.key)}</span><span class="track"><span class="held" '
            f'style="width:{100 * use.held / scale:.0f}%"></span>{mark}</span>'
            f'<span class="n">{escape(use.text)}</span></div>')
