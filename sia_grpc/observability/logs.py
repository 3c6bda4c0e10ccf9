"""Logging for every process: structlog's output format and level, chosen once at
process start (`configure_logging`, from `--log-format`/`--log-level` or the
SIA_LOG_* settings), with stdlib records (gRPC's) at WARNING+ forwarded into it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import IO, Any

import structlog

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "add_logging_arguments", "configure_logging"]

_FORMATS = ("json", "console")
LOG_FORMATS = ("auto", *_FORMATS)  # auto: console on a terminal, JSON otherwise
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def add_logging_arguments(parser: Any) -> None:
    """`--log-format` and `--log-level` on an argparse parser: one definition for
    every daemon (sia-controller, the node agent), passed to `configure_logging`."""
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                        help="json (one object a line), console, or auto: console on a "
                             "terminal, JSON otherwise (default: env SIA_LOG_FORMAT, else "
                             "auto)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                        help="the least severe level written (default: env SIA_LOG_LEVEL, "
                             "else info)")


class _Unfailing:
    """A log stream whose writes never raise. A reader that went away (a closed
    pipe: BrokenPipeError) must not turn every log call into an exception; above
    all not in a signal handler that logs before it acts, which then never acts."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):  # ValueError: the stream was closed
            return 0

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()


class _ForwardToStructlog(logging.Handler):
    """Re-emits stdlib records through structlog, so they share its format and stream."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            kw: dict[str, Any] = {"logger": record.name}
            if record.exc_info:
                kw["exc_info"] = record.exc_info
            structlog.get_logger().log(record.levelno, record.getMessage(), **kw)
        except Exception:
            self.handleError(record)


def _level_number(level: str) -> int:
    number = logging.getLevelNamesMapping().get(level.strip().upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r} (debug, info, warning, error, critical)")
    return number


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def configure_logging(
    *, fmt: str | None = None, level: str | None = None, stream: IO[str] | None = None
) -> None:
    """Configure structlog (and stdlib logging at WARNING+) to write to `stream`.

    `fmt` is "json", "console" or "auto"; unset, env `SIA_LOG_FORMAT` decides; auto (the
    default) is console on a TTY and JSON otherwise. `level` defaults to env
    `SIA_LOG_LEVEL`, else "info". `stream` defaults to `sys.stderr` at call time; writes
    to it never raise (`_Unfailing`). Calling again replaces the previous setup.
    """
    out = sys.stderr if stream is None else stream
    chosen = (fmt or os.environ.get("SIA_LOG_FORMAT") or "auto").strip().lower()
    if chosen == "auto":
        chosen = "console" if _isatty(out) else "json"
    # A bad value from the environment names the variable: the flags have choices.
    if chosen not in _FORMATS:
        where = "" if fmt else "SIA_LOG_FORMAT: "
        raise ValueError(f"{where}unknown log format {chosen!r} (json, console or auto)")
    try:
        min_level = _level_number(level or os.environ.get("SIA_LOG_LEVEL") or "info")
    except ValueError as err:
        raise ValueError(f"{'' if level else 'SIA_LOG_LEVEL: '}{err}") from None

    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if chosen == "json":
        # Tracebacks as one escaped string keep "one JSON object per line".
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        # ConsoleRenderer formats exc_info itself (and warns if format_exc_info ran first).
        processors.append(structlog.dev.ConsoleRenderer(colors=_isatty(out)))

    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        # (structlog asks for a TextIO; a WriteLogger only writes and flushes)
        logger_factory=structlog.WriteLoggerFactory(file=_Unfailing(out)),  # type: ignore[arg-type]
        # Not cached: module-level loggers must follow a later reconfiguration.
        cache_logger_on_first_use=False,
    )

    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _ForwardToStructlog)]:
        root.removeHandler(handler)
    root.addHandler(_ForwardToStructlog(level=logging.WARNING))
    if root.level > logging.WARNING:
        root.setLevel(logging.WARNING)
