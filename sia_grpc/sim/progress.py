"""Progress of long simulations on stderr (`sia simulate`, `sia bench sim`).

A run reports `(jobs finished, jobs total, simulated seconds)` after each simulated
round (`simulate(on_progress=)`); a `Reporter` passes at most one report every half
second on (to a queue, from a worker process, or to a callable in this process),
and a display shows them: on a terminal, `rich.progress` bars, one per running run;
elsewhere (a log, CI) a plain line per run at most every 30 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

REPORT_INTERVAL_S = 0.5  # a run's reports, at most this often
LINE_INTERVAL_S = 30.0  # a non-terminal's lines, per run, at most this often


@dataclass(frozen=True)
class Update:
    """One run's progress: `key` names the run (its index among the runs)."""

    key: int
    done: int
    total: int
    sim_seconds: float
    elapsed: float  # wall seconds since the run began


class Sink(Protocol):
    def put(self, item: Any) -> object: ...


class Reporter:
    """`simulate(on_progress=)` for a run: at most one `Update` each `interval`
    seconds (and the last, all jobs done) to `sink` (a multiprocessing queue, or
    anything with `put`) or to a callable."""

    def __init__(self, sink: Sink | Callable[[Update], object], key: int, *,
                 interval: float = REPORT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._put = sink.put if hasattr(sink, "put") else sink
        self._key, self._interval, self._clock = key, interval, clock
        self._start = clock()
        self._last: float | None = None

    def __call__(self, done: int, total: int, sim_seconds: float) -> None:
        now = self._clock()
        if self._last is not None and now - self._last < self._interval and done < total:
            return
        self._last = now
        self._put(Update(self._key, done, total, sim_seconds, now - self._start))


def clock_text(seconds: float) -> str:
    """01:12, or 1:02:03 past an hour."""
    s = max(int(seconds), 0)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m:02d}:{s % 60:02d}"


class Display(Protocol):
    def start(self, key: int, label: str) -> None: ...
    def update(self, u: Update) -> None: ...
    def finish(self, key: int, line: str) -> None: ...
    def log(self, line: str) -> None: ...
    def close(self) -> None: ...


class QuietDisplay:
    """`-q`: nothing at all."""

    def start(self, key: int, label: str) -> None:
        pass

    def update(self, u: Update) -> None:
        pass

    def finish(self, key: int, line: str) -> None:
        pass

    def log(self, line: str) -> None:
        pass

    def close(self) -> None:
        pass


class LineDisplay:
    """Not a terminal: "[2/4] sia on saturn/workload-1: 412/1000 jobs, 37.2 simulated
    h, 01:12 elapsed" per run at most every `interval` seconds of `clock` (the first
    `interval` after the run is started), and each run's `finish` line."""

    def __init__(self, out: TextIO, runs: int, *, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._out, self._runs, self._clock = out, runs, clock
        self._interval = LINE_INTERVAL_S if interval is None else interval
        self._labels: dict[int, str] = {}
        self._last: dict[int, float] = {}

    def start(self, key: int, label: str) -> None:
        self._labels[key] = label
        self._last[key] = self._clock()

    def update(self, u: Update) -> None:
        now = self._clock()
        if u.key not in self._last:
            self._last[u.key] = now
        if now - self._last[u.key] < self._interval:
            return
        self._last[u.key] = now
        self.log(f"[{u.key + 1}/{self._runs}] {self._labels.get(u.key, '')}: "
                 f"{u.done}/{u.total} jobs, {u.sim_seconds / 3600:.1f} simulated h, "
                 f"{clock_text(u.elapsed)} elapsed")

    def finish(self, key: int, line: str) -> None:
        self._labels.pop(key, None)
        self._last.pop(key, None)
        self.log(line)

    def log(self, line: str) -> None:
        print(line, file=self._out, flush=True)

    def close(self) -> None:
        pass


class RichDisplay:
    """A terminal: a `rich.progress` bar per running run (jobs done/total,
    simulated hours, elapsed) under one for all runs; finish lines print above.
    `auto_refresh=False` draws only on updates (no thread: `sia bench sim` times
    its runs' CPU in this process)."""

    def __init__(self, out: TextIO, runs: int, *, auto_refresh: bool = True) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"), TextColumn("{task.fields[sim]}"),
            TextColumn("{task.fields[elapsed]}"),
            console=Console(file=out), auto_refresh=auto_refresh, transient=True)
        self._auto = auto_refresh
        self._all = self._progress.add_task("all runs", total=runs, unit="runs", sim="",
                                            elapsed="")
        self._tasks: dict[int, Any] = {}
        self._labels: dict[int, str] = {}
        self._progress.start()

    def start(self, key: int, label: str) -> None:
        self._labels[key] = label

    def update(self, u: Update) -> None:
        sim = f"{u.sim_seconds / 3600:.1f} simulated h"
        elapsed = f"{clock_text(u.elapsed)} elapsed"
        if u.key not in self._tasks:
            self._tasks[u.key] = self._progress.add_task(
                self._labels.get(u.key, str(u.key)), total=u.total, unit="jobs", sim=sim,
                elapsed=elapsed)
        self._progress.update(self._tasks[u.key], completed=u.done, total=u.total, sim=sim,
                              elapsed=elapsed)
        if not self._auto:
            self._progress.refresh()

    def finish(self, key: int, line: str) -> None:
        self._labels.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            self._progress.remove_task(task)
        self._progress.advance(self._all)
        self.log(line)

    def log(self, line: str) -> None:
        self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        if not self._auto:
            self._progress.refresh()

    def close(self) -> None:
        self._progress.stop()


def make_display(out: TextIO, runs: int, *, quiet: bool = False,
                 auto_refresh: bool = True) -> Display:
    """Nothing with `quiet`; bars when `out` is a terminal; else lines."""
    if quiet:
        return QuietDisplay()
    if out.isatty():
        return RichDisplay(out, runs, auto_refresh=auto_refresh)
    return LineDisplay(out, runs)
