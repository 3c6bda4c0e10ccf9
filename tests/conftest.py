"""Fixtures and hooks shared across test directories.

Running in parallel (`make test`: `pytest -n auto`, `--dist loadgroup` from
pyproject.toml): every test gets its own ports (port 0, or
`sia_grpc.testing.ports.free_port`), directories and clocks, so any two can share
the machine. The heavy, timing-sensitive ones (process fleets, torch workers,
network namespaces, clusters at 600x real time) carry
`pytest.mark.xdist_group("heavy")`: one worker runs them one after another, while
the other workers take the rest, so they never compete with each other for the CPU.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator

import pytest
import structlog
from otlp_receiver import OtlpTraceReceiver

from sia_grpc.testing import postgres

# The fuzz tests' tally of cases per RPC (tests/fuzz/fuzzkit.py), summed over the
# xdist workers on the controlling process: {"scale": N, "rpcs": {rpc: {code: n}}}.
FUZZ_TALLY = "sia_fuzz_tally"
_FUZZ_KEY = pytest.StashKey[dict]()


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _logging_is_left_as_found() -> Iterator[None]:
    """A test leaves structlog's configuration and the root logger as it found them:
    code run in-process (a bench's `run`, a CLI command) calls `configure_logging`,
    whose level filter would otherwise hide the next test's `capture_logs` events on
    the same xdist worker (three tests failed on an empty capture that way)."""
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _signal_dispositions_are_left_as_found() -> Iterator[None]:
    """A test (and the code it runs in this process) leaves SIGTERM, SIGINT and SIGHUP
    as it found them. A handler left behind outlives its event loop: the process,
    and every child it forks without exec, then ignores SIGTERM in effect (a fork
    pool's terminate() hung in CI after a test had run uvloop with signal handlers).
    The disposition is put back either way, so one leak fails one test."""
    before = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    yield
    left = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    changed = {sig.name: left[sig] for sig in _STOP_SIGNALS if left[sig] != before[sig]}
    for sig in _STOP_SIGNALS:
        if before[sig] is not None:
            signal.signal(sig, before[sig])
    assert not changed, f"the test left signal handlers installed: {changed}"


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpTraceReceiver]:
    with OtlpTraceReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[postgres.PostgresServer]:
    """One throwaway PostgreSQL server per test process (xdist worker); the tests
    that need it skip, saying why, only where none can be had (`make venv` installs
    one as root)."""
    reason = postgres.unavailable()
    if reason is not None:
        pytest.skip(f"PostgreSQL: {reason}")
    with postgres.PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: postgres.PostgresServer) -> str:
    """The DSN (with its password) of a new, empty database on that server."""
    return postgres_server.database()


def _add_fuzz_tally(config: pytest.Config, tally: dict) -> None:
    """Add one process's fuzz tally to the run's."""
    if not tally:
        return
    run = config.stash.setdefault(_FUZZ_KEY, {"scale": tally["scale"], "rpcs": {}})
    for rpc, codes in tally["rpcs"].items():
        run["rpcs"][rpc] = dict(Counter(run["rpcs"].get(rpc, {})) + Counter(codes))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """This process's fuzz tally: to the controlling process from an xdist worker,
    else straight to the summary."""
    fuzzkit = sys.modules.get("fuzzkit")  # imported only where fuzz tests ran
    tally = {} if fuzzkit is None or not fuzzkit.TALLY else {
        "scale": fuzzkit.SCALE, "rpcs": {rpc: dict(c) for rpc, c in fuzzkit.TALLY.items()}}
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[FUZZ_TALLY] = tally
    else:
        _add_fuzz_tally(session.config, tally)


def pytest_testnodedown(node, error) -> None:
    """(pytest-xdist, on the controlling process) a worker finished: take its tally."""
    _add_fuzz_tally(node.config, node.workeroutput.get(FUZZ_TALLY, {}))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    run = config.stash.get(_FUZZ_KEY, None)
    if not run:
        return
    rpcs = run["rpcs"]
    total = sum(sum(c.values()) for c in rpcs.values())
    terminalreporter.section(f"fuzz cases per RPC (SIA_FUZZ_EXAMPLES={run['scale']})")
    for rpc in sorted(rpcs):
        codes = ", ".join(f"{k} {v}" for k, v in Counter(rpcs[rpc]).most_common())
        terminalreporter.write_line(f"{rpc:45s} {sum(rpcs[rpc].values()):7d}  ({codes})")
    terminalreporter.write_line(f"{'total':45s} {total:7d}")
    path = os.environ.get("SIA_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"scale": run["scale"], "total": total,
                       "rpcs": {k: v for k, v in sorted(rpcs.items())}}, f, indent=1)
