"""One job's page: its facts, why it waits or holds what it holds, its allocation and
rates over time, its restarts and the decisions about it. `job_detail` is also what
the browser fetches again as the job changes."""

from __future__ import annotations

from html import escape

from sia_grpc.api import TERMINAL_STATES, pb, seconds, state_name
from sia_grpc.api.present import format_gpus, format_nodes, job_priority, job_reason
from sia_grpc.api.story import kind_name
from sia_grpc.dashboard.charts import allocation_chart, rate_chart
from sia_grpc.dashboard.model import JobRecord, Model, Restart
from sia_grpc.dashboard.style import type_colours, utc


def job_page(rec: JobRecord, model: Model, now: float,
             story: list[pb.Event] | None = None) -> str:
    return (f'<h1>Job <span class="mono">{escape(rec.job.job_id)}</span></h1>'
            f'<div id="detail">{job_detail(rec, model, now, story)}</div>')


def job_detail(rec: JobRecord, model: Model, now: float,
               story: list[pb.Event] | None = None) -> str:
    """`story`: the job's events from the controller's history (`sia describe`'s);
    None where it could not be read: then the decisions this dashboard saw."""
    j, st = rec.job, rec.job.status
    state = state_name(st.state)
    why = job_reason(j)
    question = ("Why is it waiting?" if st.state in (pb.JOB_STATE_QUEUED, pb.JOB_STATE_PROFILING)
                else "How it ended" if st.state in TERMINAL_STATES else "Why this allocation?")
    facts = [("state", f'<b class="state {state.lower()}">{state}</b>'),
             ("name", escape(j.spec.name or "-")), ("tenant", escape(j.spec.tenant or "-")),
             ("queue", escape(j.spec.queue or "default")),
             ("priority", escape(job_priority(j, model.queues.config.default_priority
                                              if model.queues.HasField("config") else None))),
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
    notes = _story(story) if story is not None else "".join(
        f'<li><time>{utc(n.at)}</time> <b class="state {n.state.lower()}">{n.state}</b> '
        f'{escape(n.text)}</li>' for n in reversed(rec.notes)) or '<li class="empty">none yet</li>'
    return f"""<div class="why"><h2>{question}</h2><p id="why">{escape(why or
        "the controller has recorded no reason yet")}</p></div>
<div class="columns"><dl class="facts">{dl}</dl>
<div><h2>Allocation over time</h2>{chart}
<p class="hint">As seen since {utc(rec.seen_from)}; earlier, what its create, start and
last change times tell, and hatched grey where what it held is not known.</p>
<h2>Goodput and throughput</h2>{rate_chart(rec.rates, end)}</div></div>
<h2>Restarts</h2>{restarts_table(rec.restarts)}
<h2>{"Story" if story is not None else "Decisions"}</h2><ol class="notes" id="notes">{notes}</ol>"""


def _story(events: list[pb.Event]) -> str:
    """The job's events, newest first, as `sia describe` tells them (oldest first)."""
    return "".join(
        f'<li data-id="{e.id}"><time>{utc(seconds(e.time))}</time> '
        f'<b class="kind">{escape(kind_name(e.kind))}</b> {escape(e.message)}</li>'
        for e in reversed(events)) or '<li class="empty">none kept</li>'


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
