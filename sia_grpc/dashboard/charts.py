"""The dashboard's charts, as inline SVG drawn on the server: a step chart of GPUs or
jobs over time, a queue's use against its guarantee, a job's goodput against its
throughput, and a row of captioned panels to put them in."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from html import escape
from typing import Any

from sia_grpc.dashboard.model import UNKNOWN, Rate, Step, Use
from sia_grpc.dashboard.style import utc

# The two lines of a job's rate chart: (attribute of `Rate`, its label, Okabe & Ito's
# blue and vermilion, a dash pattern), so they stay apart without colour too.
RATE_LINES = [("goodput", "goodput (scheduler's estimate)", "#0072B2", ""),
              ("throughput", "throughput (reported)", "#D55E00", "6 3")]


def allocation_chart(history: list[Step], end: float, colours: dict[str, str]) -> str:
    """A job's GPUs over time, each step coloured by its GPU type, and the legend."""
    used = sorted({s.gpu_type for s in history if s.num_gpus})
    legend = "".join(f'<span><i style="background:{colours.get(t, "#999")}"></i>'
                     f'{escape(t)}</span>' for t in used)
    if any(s.gpu_type == UNKNOWN for s in history):
        legend += '<span class="unknown"><i style="background:#ddd"></i>not known</span>'
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
    (`num_gpus`) coloured by its key (`gpu_type`; `UNKNOWN`: a hatched gap), the steps'
    outline on top, and with `capacity` a dashed line there."""
    top = max([s.num_gpus for s in steps] + [capacity or 0, 1])
    p = _Plot.over([s.at for s in steps], end, top, width, height)
    segments = p.steps([(s.at, s.num_gpus) for s in steps])
    shapes = [
        _bar(p, x0, x1, 0, s.num_gpus, colours.get(s.gpu_type, "#999"),
             f'class="alloc-step" data-type="{escape(s.gpu_type)}" data-gpus="{s.num_gpus}"',
             f"{s.num_gpus} {s.gpu_type} from {utc(s.at)}")
        for s, (x0, x1, _) in zip(steps, segments, strict=True) if s.num_gpus]
    unknown = _unknown(p, steps, segments, top)
    cap = (f'<line class="capacity" x1="{p.pad_l}" y1="{p.y(capacity):.1f}" '
           f'x2="{width - p.pad_r}" y2="{p.y(capacity):.1f}"><title>capacity {capacity}'
           f'</title></line>' if capacity else "")
    outline = f'<polyline class="step" points="{_points(segments)}"/>'
    return p.svg(f'{unknown}{"".join(shapes)}{outline}{cap}\n', label=label,
                 ticks=_ticks(top))


def _unknown(p: _Plot, steps: list[Step], segments: list[tuple[float, float, float]],
             top: float) -> str:
    """The spans where what the job held is not known (`UNKNOWN`): hatched grey, the
    chart's height, so that they read as a gap rather than as nothing held."""
    spans = "".join(
        f'<rect class="unknown" x="{x0:.1f}" y="{p.y(top):.1f}" width="{max(x1 - x0, 0.5):.1f}" '
        f'height="{p.y(0) - p.y(top):.1f}" fill="url(#unknown)"><title>not known: before '
        f'this dashboard saw it, from {utc(s.at)}</title></rect>'
        for s, (x0, x1, _) in zip(steps, segments, strict=True) if s.gpu_type == UNKNOWN)
    if not spans:
        return ""
    return ('<defs><pattern id="unknown" width="6" height="6" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff"/>'
            '<rect width="2" height="6" fill="#bbb"/></pattern></defs>' + spans)


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


def panel_row(panels: list[tuple[str, str]]) -> str:
    """Charts side by side, each under its caption."""
    return '<div class="panels">' + "".join(
        f'<figure class="panel"><figcaption>{escape(title)}</figcaption>{chart}</figure>'
        for title, chart in panels) + "</div>"
