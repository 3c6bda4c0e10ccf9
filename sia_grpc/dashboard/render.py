"""The dashboard's pages as HTML, drawn on the server (charts are inline SVG): pure
functions of the `Model` and the time. The browser's script (static/dashboard.js) swaps
in the fragments the server pushes (`job_row`, `cluster_section`, `round_row`,
`queues_section`) as events arrive."""

from __future__ import annotations

import datetime
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote

from sia_grpc.api import OTHER_TENANT, TERMINAL_STATES, node_state_name, pb, seconds, state_name
from sia_grpc.api.present import format_counts, format_gpus, format_nodes, job_age, job_reason
from sia_grpc.dashboard.model import UNITS, JobRecord, Model, Rate, Restart, Step, Use


def job_href(job_id: str) -> str:
    """The job page's link: an id may hold '/' (`tenant/name`), one path segment."""
    return "/jobs/" + escape(quote(job_id, safe=""))


# Okabe & Ito's palette (less black): told apart with each common colour-vision
# deficiency. Each colour comes with the text colour that reads on it.
PALETTE = [("#E69F00", "#000"), ("#56B4E9", "#000"), ("#009E73", "#fff"),
           ("#F0E442", "#000"), ("#0072B2", "#fff"), ("#D55E00", "#fff"),
           ("#CC79A7", "#000")]
# The two lines of a job's rate chart: (attribute of `Rate`, its label, Okabe & Ito's
# blue and vermilion, a dash pattern), so they stay apart without colour too.
RATE_LINES = [("goodput", "goodput (scheduler's estimate)", "#0072B2", ""),
              ("throughput", "throughput (reported)", "#D55E00", "6 3")]
MOVES_SHOWN = 20  # the jobs listed under a round (then "and N more")
PAGES = [("/", "Cluster"), ("/jobs", "Jobs"), ("/rounds", "Rounds"), ("/queues", "Queues")]


def job_colour(job_id: str) -> tuple[str, str]:
    """A job's colour (and its text's): the same on every page and every restart."""
    return PALETTE[zlib.crc32(job_id.encode()) % len(PALETTE)]


def type_colours(types: Iterable[str]) -> dict[str, str]:
    """A colour per GPU type, by name order (so a type keeps its colour as jobs come
    and go, as long as the cluster's types stay the same)."""
    return {t: PALETTE[i % len(PALETTE)][0] for i, t in enumerate(sorted(set(types)))}


def utc(at: float) -> str:
    """Seconds since the epoch as "2026-01-05 09:30:00Z"; "-" for 0."""
    if not at:
        return "-"
    when = datetime.datetime.fromtimestamp(at, datetime.UTC).replace(microsecond=0)
    return when.replace(tzinfo=None).isoformat(sep=" ") + "Z"


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


# -- one job -----------------------------------------------------------------------------


def job_page(rec: JobRecord, model: Model, now: float) -> str:
    return (f'<h1>Job <span class="mono">{escape(rec.job.job_id)}</span></h1>'
            f'<div id="detail">{job_detail(rec, model, now)}</div>')


def job_detail(rec: JobRecord, model: Model, now: float) -> str:
    j, st = rec.job, rec.job.status
    state = state_name(st.state)
    why = job_reason(j)
    question = ("Why is it waiting?" if st.state in (pb.JOB_STATE_QUEUED, pb.JOB_STATE_PROFILING)
                else "How it ended" if st.state in TERMINAL_STATES else "Why this allocation?")
    facts = [("state", f'<b class="state {state.lower()}">{state}</b>'),
             ("name", escape(j.spec.name or "-")), ("tenant", escape(j.spec.tenant or "-")),
             ("queue", escape(j.spec.queue or "default")),
             ("priority", escape(j.spec.priority or "default")),
             ("application", escape(j.spec.application or "-")),
             ("GPUs", escape(format_gpus(j))), ("nodes", escape(format_nodes(j))),
             ("batch", str(st.allocation.batch_size or "-")),
             ("progress", f"{st.progress * 100:.1f}%"),
             ("goodput (estimate)", f"{st.goodput:.3g} samples/s"),
             ("throughput (reported)", f"{st.throughput:.3g} samples/s"),
             ("restarts", str(st.restarts)),
             ("last restart cost", f"{st.restart_seconds:.1f} s" if st.restart_seconds else "-"),
             ("generation", str(st.generation)),
             ("created", utc(seconds(st.create_time))), ("started", utc(seconds(st.start_time))),
             ("finished", utc(seconds(st.finish_time)))]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    end = seconds(st.finish_time) or now
    chart = allocation_chart(rec.history, end, type_colours(
        [t.gpu_type for t in model.cluster.types] + [s.gpu_type for s in rec.history]))
    notes = "".join(
        f'<li><time>{utc(n.at)}</time> <b class="state {n.state.lower()}">{n.state}</b> '
        f'{escape(n.text)}</li>' for n in reversed(rec.notes)) or '<li class="empty">none yet</li>'
    return f"""<div class="why"><h2>{question}</h2><p id="why">{escape(why or
        "the controller has recorded no reason yet")}</p></div>
<div class="columns"><dl class="facts">{dl}</dl>
<div><h2>Allocation over time</h2>{chart}
<p class="hint">As seen since {utc(rec.seen_from)} (earlier: from its create and start
times only).</p>
<h2>Goodput and throughput</h2>{rate_chart(rec.rates, end)}</div></div>
<h2>Restarts</h2>{restarts_table(rec.restarts)}
<h2>Decisions</h2><ol class="notes" id="notes">{notes}</ol>"""


def allocation_chart(history: list[Step], end: float, colours: dict[str, str]) -> str:
    """A job's GPUs over time, each step coloured by its GPU type, and the legend."""
    used = sorted({s.gpu_type for s in history if s.num_gpus})
    legend = "".join(f'<span><i style="background:{colours.get(t, "#999")}"></i>'
                     f'{escape(t)}</span>' for t in used)
    return (step_chart(history, end, colours, label="GPUs held over time") +
            f'<div class="legend">{legend or "<span class=empty>no GPUs held yet</span>"}'
            f'</div>')


@dataclass(frozen=True)
class _Plot:
    """A chart's area: times from `start` to `end` across, values 0 to `top` up."""

    start: float
    end: float
    top: float
    width: int
    height: int
    pad_l: int = 34  # room for the values' labels
    pad_b, pad_t, pad_r = 22, 8, 8

    @classmethod
    def over(cls, times: list[float], end: float, top: float, width: int, height: int,
             **kw: Any) -> _Plot:
        end = max([end, *times])  # (a controller's clock a little ahead)
        return cls(times[0] if times else end, end, top, width, height, **kw)

    def x(self, at: float) -> float:
        plot_w = self.width - self.pad_l - self.pad_r
        return self.pad_l + plot_w * (min(at, self.end) - self.start) / max(
            self.end - self.start, 1e-9)

    def y(self, value: float) -> float:
        plot_h = self.height - self.pad_b - self.pad_t
        return self.pad_t + plot_h * (1 - value / self.top)

    def steps(self, points: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
        """Each (from, value) of a series that holds its value until the next one's
        time (the last one's until `end`) as (x from, x to, y)."""
        out = []
        for i, (at, value) in enumerate(points):
            right = points[i + 1][0] if i + 1 < len(points) else self.end
            out.append((self.x(at), self.x(max(right, at)), self.y(value)))
        return out

    def svg(self, body: str, *, label: str, ticks: list[tuple[float, str]],
            unit: str = "") -> str:
        """The chart: the values' labels at `ticks`, the time axis, `body`."""
        marks = "".join(f'<text x="{self.pad_l - 6}" y="{self.y(v) + 4:.1f}" '
                        f'text-anchor="end">{text}</text>' for v, text in ticks)
        if unit:  # the values' unit, up the left side
            marks += (f'<text class="unit" x="10" y="{self.pad_t + 40}" text-anchor="end" '
                      f'transform="rotate(-90 10 {self.pad_t + 40})">{escape(unit)}</text>')
        right, w, h = self.width - self.pad_r, self.width, self.height
        return f"""<svg class="alloc" viewBox="0 0 {w} {h}" width="{w}" height="{h}"
role="img" aria-label="{escape(label)}">{marks}
<line x1="{self.pad_l}" y1="{self.y(0):.1f}" x2="{right}" y2="{self.y(0):.1f}" class="axis"/>
{body}<text x="{self.pad_l}" y="{h - 4}">{utc(self.start)}</text>
<text x="{right}" y="{h - 4}" text-anchor="end">{utc(self.end)}</text></svg>"""


def _points(segments: list[tuple[float, float, float]]) -> str:
    return " ".join(f"{x0:.1f},{y:.1f} {x1:.1f},{y:.1f}" for x0, x1, y in segments)


def step_chart(steps: list[Step], end: float, colours: dict[str, str], *, label: str,
               capacity: int | None = None, width: int = 560, height: int = 180) -> str:
    """A step chart (SVG) of `steps` up to `end`: each step a bar of its value
    (`num_gpus`) coloured by its key (`gpu_type`), the steps' outline on top, and with
    `capacity` a dashed line there."""
    top = max([s.num_gpus for s in steps] + [capacity or 0, 1])
    p = _Plot.over([s.at for s in steps], end, top, width, height)
    segments = p.steps([(s.at, s.num_gpus) for s in steps])
    shapes = [
        _bar(p, x0, x1, 0, s.num_gpus, colours.get(s.gpu_type, "#999"),
             f'class="alloc-step" data-type="{escape(s.gpu_type)}" data-gpus="{s.num_gpus}"',
             f"{s.num_gpus} {s.gpu_type} from {utc(s.at)}")
        for s, (x0, x1, _) in zip(steps, segments, strict=True) if s.num_gpus]
    cap = (f'<line class="capacity" x1="{p.pad_l}" y1="{p.y(capacity):.1f}" '
           f'x2="{width - p.pad_r}" y2="{p.y(capacity):.1f}"><title>capacity {capacity}'
           f'</title></line>' if capacity else "")
    body = f'{"".join(shapes)}<polyline class="step" points="{_points(segments)}"/>{cap}\n'
    return p.svg(body, label=label, ticks=_ticks(top))


def _bar(p: _Plot, x0: float, x1: float, low: float, high: float, fill: str, attrs: str,
         title: str) -> str:
    """One step's bar, from value `low` up to `high`, between `x0` and `x1`."""
    return (f'<rect {attrs} x="{x0:.1f}" y="{p.y(high):.1f}" width="{max(x1 - x0, 0.5):.1f}" '
            f'height="{p.y(low) - p.y(high):.1f}" fill="{fill}"><title>{escape(title)}'
            f'</title></rect>')


def _label_y(p: _Plot, value: float) -> float:
    """Where a line's label goes: just above the line at `value`, or just below it
    where there is no room above (a line at the top of the chart)."""
    y = p.y(value)
    return y - 3 if y - 3 > p.pad_t + 8 else y + 11


def _ticks(top: float) -> list[tuple[float, str]]:
    """The value labels of a chart up to `top`: 0, the middle, `top`."""
    mid = top // 2 if float(top).is_integer() else top / 2
    return [(v, f"{v:g}") for v in sorted({0, mid, top})]


def use_chart(series: list[Use], end: float, colour: str, *, label: str, unit: str,
              width: int = 300, height: int = 120) -> str:
    """What a queue held over time against its guarantee (SVG): the held bars in
    `colour`, the part it borrowed (beyond its guarantee) hatched, and the guarantee
    as a dashed line, labelled, so the three read apart without colour."""
    top = max([max(u.held, u.guarantee) for u in series] + [1])
    p = _Plot.over([u.at for u in series], end, top, width, height)
    held = p.steps([(u.at, u.held) for u in series])
    hatch = f"borrowed-{zlib.crc32(label.encode()):x}"  # (one pattern per chart: ids unique)
    shapes = []
    for u, (x0, x1, _) in zip(series, held, strict=True):
        title = f"{u.held:g} {unit} held from {utc(u.at)}, guarantee {u.guarantee:g}"
        if u.held - u.borrowed > 0:
            shapes.append(_bar(p, x0, x1, 0, u.held - u.borrowed, colour,
                               f'class="held" data-held="{u.held:g}"', title))
        if u.borrowed:
            shapes.append(_bar(p, x0, x1, u.held - u.borrowed, u.held, f"url(#{hatch})",
                               f'class="borrowed" data-borrowed="{u.borrowed:g}"',
                               f"{u.borrowed:g} {unit} borrowed from {utc(u.at)}"))
    guarantee = p.steps([(u.at, u.guarantee) for u in series])
    now = series[-1] if series else Use(end, 0, 0)
    body = (f'<defs><pattern id="{hatch}" width="6" height="6" patternUnits="userSpaceOnUse" '
            f'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff"/>'
            f'<rect width="3" height="6" fill="{colour}"/></pattern></defs>'
            f'{"".join(shapes)}<polyline class="step held-line" points="{_points(held)}"/>'
            f'<polyline class="guarantee" data-guarantee="{now.guarantee:g}" '
            f'points="{_points(guarantee)}"><title>guarantee: {now.guarantee:g} {unit}'
            f'</title></polyline><text class="guarantee-label" x="{width - p.pad_r - 2}" '
            f'y="{_label_y(p, now.guarantee):.1f}" text-anchor="end">guarantee '
            f'{now.guarantee:g}</text>\n')
    return p.svg(body, label=label, ticks=_ticks(top))


def rate_chart(rates: list[Rate], end: float, *, width: int = 560, height: int = 180) -> str:
    """The job's goodput as the scheduler estimated it against the throughput its
    workers reported, over time (samples/s; both hold until they change), and the
    legend. An estimate above the throughput is a model that promised too much."""
    if not rates:
        return '<p class="empty">no goodput estimate or throughput report yet</p>'
    top = max(max(r.goodput, r.throughput) for r in rates) or 1.0
    p = _Plot.over([r.at for r in rates], end, top, width, height, pad_l=52)
    lines = "".join(
        f'<polyline class="rate" data-series="{name}" fill="none" stroke="{colour}" '
        f'stroke-width="2" stroke-dasharray="{dash or "none"}" points="'
        f'{_points(p.steps([(r.at, getattr(r, name)) for r in rates]))}">'
        f'<title>{escape(label)}: {getattr(rates[-1], name):.4g} samples/s now</title>'
        f'</polyline>' for name, label, colour, dash in RATE_LINES)
    legend = "".join(
        f'<span data-series="{name}"><svg width="24" height="10" aria-hidden="true">'
        f'<line x1="0" y1="5" x2="24" y2="5" stroke="{colour}" stroke-width="2" '
        f'stroke-dasharray="{dash or "none"}"/></svg> {escape(label)}</span>'
        for name, label, colour, dash in RATE_LINES)
    ticks = [(v, f"{v:.3g}") for v in (0.0, top / 2, top)]
    return (p.svg(lines + "\n", label="goodput estimate and reported throughput over time",
                  ticks=ticks, unit="samples/s")
            + f'<div class="legend rates">{legend} <span class="unit">(samples/s)</span></div>')


def restarts_table(restarts: list[Restart]) -> str:
    """The restarts this dashboard saw, newest first: when, from which GPUs to which,
    and what each cost as the controller measured it."""
    def gpus(held: tuple[str, int] | None, pending: str) -> str:
        return pending if held is None else f"{held[1]} {held[0]}" if held[1] else "-"

    def cost(r: Restart, last: bool) -> str:
        if r.seconds is not None:
            return f"{r.seconds:.1f} s"
        # One that the next restart cut short never reported a step: never measured.
        return "measuring" if last else "none: restarted again before its first step"

    rows = "".join(
        f'<tr class="restart" data-generation="{r.generation}"><td>{utc(r.at)}</td>'
        f'<td class="from">{escape(gpus(r.src, "-"))}</td>'
        f'<td class="to">{escape(gpus(r.dst, "not running yet"))}</td>'
        f'<td class="cost">{cost(r, r is restarts[-1])}</td></tr>' for r in reversed(restarts))
    if not rows:
        return '<p class="empty" id="no-restarts">none seen</p>'
    return (f'<table class="restarts" id="restarts"><thead><tr><th>WHEN</th><th>FROM</th>'
            f'<th>TO</th><th>MEASURED COST</th></tr></thead><tbody>{rows}</tbody></table>'
            f'<p class="hint">The cost: from its checkpoint-stop to its first step at the '
            f'next allocation, waiting for GPUs included, on the controller\'s clock.</p>')


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
            '</p>' + _panels(panels))


def _panels(panels: list[tuple[str, str]]) -> str:
    """Charts side by side, each under its caption."""
    return '<div class="panels">' + "".join(
        f'<figure class="panel"><figcaption>{escape(title)}</figcaption>{chart}</figure>'
        for title, chart in panels) + "</div>"


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
    if not model.queues.queues:
        return '<section id="queues"><p class="empty">no queues</p></section>'
    rows = []
    for q in model.queues.queues:
        s = q.spec
        types = sorted(set(s.guarantee) | set(q.held))
        bars = "".join(_use_bar(t, q.held.get(t, 0), s.guarantee.get(t, 0)) for t in types)
        rows.append(
            f'<tr data-queue="{escape(s.name)}"><th>{escape(s.name)}</th>'
            f'<td>{escape(",".join(s.tenants) or "*")}</td>'
            f'<td>{escape(format_counts(s.guarantee))}</td><td>{escape(format_counts(q.held))}'
            f'</td><td>{escape(format_counts(q.borrowed))}</td><td>{q.pending_jobs}</td>'
            f'<td>{q.running_jobs}</td><td class="bars">{bars or "-"}</td></tr>')
    return (f'<section id="queues"><table class="queues"><thead><tr><th>QUEUE</th>'
            f'<th>TENANTS</th><th>GUARANTEE</th><th>HELD</th><th>BORROWED</th><th>PENDING</th>'
            f'<th>RUNNING</th><th>USE</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
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
            panels.append((f"{what}: {last.held:g} held of {last.guarantee:g} guaranteed"
                           + (f", {last.borrowed:g} borrowed" if last.borrowed else ""),
                           use_chart(series, now, colours.get(key, "#009E73"), unit=unit,
                                     label=f"queue {name}: {what} held over time")))
        panels.append((f"jobs pending: {q.pending_jobs}", step_chart(
            hist.pending, now, {"pending": "#CC79A7"}, label=f"queue {name}: jobs pending "
            "over time", width=300, height=120)))
        parts.append(f'<div class="queue-use" data-queue="{escape(name)}"><h3>queue '
                     f'{escape(name)}</h3>{_panels(panels)}</div>')
    if not parts:
        return ""
    return ('<h2>Over time</h2><p class="hint">As this dashboard saw it since it started: '
            'the bars what each queue held (hatched: borrowed, beyond its guarantee), the '
            'dashed line its guarantee.</p>' + "".join(parts))


def _use_bar(gpu_type: str, held: int, guarantee: int) -> str:
    scale = max(held, guarantee, 1)
    over = " over" if held > guarantee else ""
    return (f'<div class="use{over}" title="{escape(gpu_type)}: {held} held, {guarantee} '
            f'guaranteed"><span class="t">{escape(gpu_type)}</span><span class="track">'
            f'<span class="held" style="width:{100 * held / scale:.0f}%"></span>'
            f'<span class="mark" style="left:{100 * guarantee / scale:.0f}%"></span></span>'
            f'<span class="n">{held}/{guarantee}</span></div>')
