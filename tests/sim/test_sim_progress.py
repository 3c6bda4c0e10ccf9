"""Progress of simulations: the engine's callback, its rate limit, the displays
(bars on a terminal, rate-limited lines elsewhere, nothing with -q), and that
reporting progress changes no result."""

from __future__ import annotations

import dataclasses
import io

import pytest

from sia_grpc.cli import main
from sia_grpc.sim import progress
from sia_grpc.sim.progress import (
    LineDisplay,
    QuietDisplay,
    Reporter,
    RichDisplay,
    Update,
    make_display,
)
from sia_grpc.sim.runner import Variant, run_one

# `trace`: tests/sim/conftest.py's three-job trace.


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("policy", ["fifo", "sia"])
def test_callback_counts_are_monotone_and_end_at_total(trace, policy):
    calls: list[tuple[int, int, float]] = []
    result = run_one(str(trace), Variant(policy, {}), "hetero64", 1,
                     on_progress=lambda *a: calls.append(a))
    assert len(calls) == len(result.rounds)  # once per simulated round
    done = [c[0] for c in calls]
    assert done == sorted(done) and done[-1] == 3
    assert {c[1] for c in calls} == {3}
    sim = [c[2] for c in calls]
    assert all(b > a for a, b in zip(sim, sim[1:], strict=False))
    assert sim[-1] == pytest.approx(result.rounds[-1].time + result.round_seconds)


def _untimed(result):
    """A result less what is measured in wall or CPU time."""
    return dataclasses.replace(
        result, wall_seconds=0.0, cpu_seconds=0.0,
        rounds=tuple(dataclasses.replace(r, policy_seconds=0.0) for r in result.rounds))


@pytest.mark.parametrize("policy", ["fifo", "sia"])
def test_results_identical_with_and_without_the_callback(trace, policy):
    plain = run_one(str(trace), Variant(policy, {}), "hetero64", 1)
    seen: list[Update] = []
    reported = run_one(str(trace), Variant(policy, {}), "hetero64", 1,
                       on_progress=Reporter(seen.append, 0, interval=0.0))
    assert seen and seen[-1].done == seen[-1].total == 3
    assert _untimed(reported) == _untimed(plain)


def test_reporter_rate_limits_but_always_sends_the_last():
    clock, sent = FakeClock(), []
    report = Reporter(sent.append, 7, interval=0.5, clock=clock)
    for t, done in [(0.0, 0), (0.1, 0), (0.4, 1), (0.6, 1), (0.7, 2), (0.8, 3)]:
        clock.now = t
        report(done, 3, 60.0 * (done + 1))
    assert [(u.key, u.done, u.elapsed) for u in sent] == [(7, 0, 0.0), (7, 1, 0.6),
                                                          (7, 3, 0.8)]


def test_line_display_format_and_rate_limit():
    clock, out = FakeClock(), io.StringIO()
    display = LineDisplay(out, 4, interval=30.0, clock=clock)
    display.start(1, "sia on saturn/workload-1")
    update = Update(1, 412, 1000, 37.2 * 3600, 72.0)
    for t in (0.0, 10.0, 29.9):
        clock.now = t
        display.update(update)
    assert out.getvalue() == ""  # nothing before 30 s
    clock.now = 30.0
    display.update(update)
    assert out.getvalue() == ("[2/4] sia on saturn/workload-1: 412/1000 jobs, "
                              "37.2 simulated h, 01:12 elapsed\n")
    clock.now = 59.0
    display.update(dataclasses.replace(update, done=500))
    assert out.getvalue().count("\n") == 1
    clock.now = 60.5
    display.update(dataclasses.replace(update, done=600, elapsed=3723.0))
    assert out.getvalue().splitlines()[-1].endswith("600/1000 jobs, 37.2 simulated h, "
                                                    "1:02:03 elapsed")
    display.finish(1, "[1/4] sia on saturn/workload-1: 795 rounds, 6.2 CPU-s")
    assert out.getvalue().splitlines()[-1] == ("[1/4] sia on saturn/workload-1: "
                                               "795 rounds, 6.2 CPU-s")


def test_make_display_picks_by_terminal_and_quiet():
    assert isinstance(make_display(Tty(), 2, quiet=True), QuietDisplay)
    assert isinstance(make_display(io.StringIO(), 2), LineDisplay)
    tty = Tty()
    display = make_display(tty, 2, auto_refresh=False)
    assert isinstance(display, RichDisplay)
    display.start(0, "fifo on tiny.csv")
    display.update(Update(0, 1, 3, 600.0, 2.0))
    display.finish(0, "[1/2] fifo on tiny.csv: 9 rounds, 0.1 CPU-s")
    display.close()
    assert "[1/2] fifo on tiny.csv: 9 rounds, 0.1 CPU-s" in tty.getvalue()


def test_quiet_prints_only_the_table(trace, capsys):
    assert main(["simulate", str(trace), "--policy", "fifo", "--jobs", "1", "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.split()[:3] == ["name", "jobs", "done"]


def test_progress_lines_come_from_the_worker_processes(trace, capsys, monkeypatch):
    # Every report the (child's rate-limited) runs send becomes a line here.
    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 0.0)
    assert main(["simulate", str(trace), "--policy", "fifo", "--jobs", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"[1/1] fifo on {trace}: ") and err[-1].endswith(" CPU-s")
    lines = [line for line in err if " jobs, " in line]
    assert lines, err
    assert lines[-1].startswith(f"[1/1] fifo on {trace}: 3/3 jobs, ")
    assert lines[-1].endswith(" elapsed") and " simulated h, " in lines[-1]
