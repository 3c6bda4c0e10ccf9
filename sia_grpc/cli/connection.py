"""How a `sia` command reaches the controller, and what it says when it cannot.

The connection flags (`connection_flags`: address, token, TLS files, each with its
environment variable) and the client they make (`connect`); `controller_command`
declares a command that takes them. A failed call becomes one `error: ...` line
(`api_error_line`): a connection that failed below gRPC is told apart from the
controller's answer, and a TLS mismatch is found by a handshake of our own and said
with the flags that fix it.
"""

from __future__ import annotations

import argparse
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import grpc

from sia_grpc.api.errors import ApiError
from sia_grpc.cli import argparsing
from sia_grpc.cli.argparsing import UsageError
from sia_grpc.client.sdk import DEFAULT_TARGET, SiaClient
from sia_grpc.client.spec import SpecError
from sia_grpc.security.tls import probe_tls

T = TypeVar("T")


def connection_flags(p: Any, *, defaults: bool = True) -> Any:
    """--controller, --token-file, --ca, --cert, --key: how a command reaches the
    controller (`connect`), on parser or argument group `p`. `defaults=False`: none
    (argparse.SUPPRESS), for the same flags before the subcommand
    (`argparsing.GlobalFlagsFirst`)."""
    def default(value: str | None) -> str | None:
        return value if defaults else argparse.SUPPRESS

    p.add_argument("--controller", metavar="HOST:PORT[,HOST:PORT]",
                   default=default(DEFAULT_TARGET),
                   # (Not DEFAULT_TARGET in the text: it is SIA_CONTROLLER when set,
                   # and the help, docs/cli.md's too, is the same wherever it is read.)
                   help="the controller's address, or a pair's comma-separated, or one "
                        "DNS name with several records (the leader is found; default: env "
                        "SIA_CONTROLLER, else 127.0.0.1:50051)")
    p.add_argument("--token-file", metavar="FILE", default=default(None),
                   help="file holding the bearer token (default: env SIA_TOKEN, the "
                        "token itself)")
    p.add_argument("--ca", metavar="FILE", default=default(None),
                   help="CA certificate (PEM) of the controller's TLS certificate: "
                        "connect with TLS (env SIA_CA; default plaintext)")
    p.add_argument("--cert", metavar="FILE", default=default(None),
                   help="client certificate (PEM; env SIA_CERT)")
    p.add_argument("--key", metavar="FILE", default=default(None),
                   help="its private key (PEM; env SIA_KEY)")
    return p


def controller_command(subparsers: Any, name: str, summary: str,
                       func: Callable[[argparse.Namespace], int]) -> Any:
    """A command that talks to the controller: the connection flags, and a spec file
    that cannot be used as the user's error (exit 2)."""
    return connection_flags(
        argparsing.command(subparsers, name, summary, func, usage=(SpecError,)))


def _token(args: argparse.Namespace) -> str | None:
    """--token-file's contents, else $SIA_TOKEN (the token itself)."""
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip()
        except OSError as err:
            raise UsageError(f"--token-file: cannot read {args.token_file}: "
                              f"{err.strerror or err}") from None
        if not token:
            raise UsageError(f"--token-file: {args.token_file} is empty")
        return token
    return os.environ.get("SIA_TOKEN", "").strip() or None


def _files(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """The TLS files (CA, client certificate, key): flags, else environment."""
    return (args.ca or os.environ.get("SIA_CA") or None,
            args.cert or os.environ.get("SIA_CERT") or None,
            args.key or os.environ.get("SIA_KEY") or None)


def connect(args: argparse.Namespace, make: Callable[..., Any] = SiaClient) -> Any:
    """A client (`make`: SiaClient, or AsyncSiaClient) for the connection flags
    (`connection_flags`): the controller's address, its token and TLS files."""
    ca, cert, key = _files(args)
    try:
        return make(args.controller, token=_token(args), ca=ca, cert=cert, key=key)
    except ValueError as err:  # an unreadable PEM file, a cert without its key
        raise UsageError(str(err)) from None


def describe_error(err: ApiError, target: str, hint: str | None = None) -> str:
    """`hint`: what a failed connection's cause is, when known (`_transport_hint`)."""
    if hint:
        return hint
    # Connection failures come from the client library with no ErrorInfo reason;
    # an UNAVAILABLE the controller chose to send has one and is shown as sent.
    if not err.reason and err.code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the controller at {target} (UNAVAILABLE)"
    if not err.reason and err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the controller at {target} did not answer in time (DEADLINE_EXCEEDED)"
    return str(err)


def unreachable(err: ApiError) -> bool:
    """A failure of the connection, not the controller's answer about one request."""
    return not err.reason and err.code in (grpc.StatusCode.UNAVAILABLE,
                                           grpc.StatusCode.DEADLINE_EXCEEDED)


def _transport_hint(err: ApiError, args: argparse.Namespace) -> str | None:
    """For a connection that failed below gRPC (UNAVAILABLE, no reason): a TLS
    mismatch found by a handshake of our own, said with the flags that fix it."""
    if err.reason or err.code != grpc.StatusCode.UNAVAILABLE:
        return None
    ca, cert, key = _files(args)
    problem = probe_tls(args.controller.split(",")[0].strip(), ca, cert, key)  # (of a pair: one)
    if problem is None:
        return None
    return problem.hint(ca=ca, cert=cert, ca_flag="--ca FILE (or SIA_CA)",
                        cert_flags="--cert FILE --key FILE (or SIA_CERT, SIA_KEY)",
                        issue="sia certs issue DIR --admin NAME")


def api_error_line(err: ApiError, args: argparse.Namespace) -> str:
    """How a command that talks to a controller reports its error (exit 1)."""
    return f"error: {describe_error(err, args.controller, _transport_hint(err, args))}"


def interruptible(stream: Iterable[T]) -> Iterator[T]:
    """`stream`'s items (a watch, a job followed), read on a thread of their own, so
    that Ctrl-C raises its KeyboardInterrupt in this thread's wait for the next item
    and never inside gRPC's iteration of a call: interrupted there, the call's state
    is left unfinished and closing its channel (on the way out of `connect`) waits
    for it forever (seen with `sia events -w`, one Ctrl-C in three). Closing the
    channel cancels the call the thread is reading, which ends it."""
    items: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=64)

    def read() -> None:
        try:
            for item in stream:
                items.put((True, item))
        except BaseException as err:  # (handed to the reader, which raises it)
            items.put((False, err))
        else:
            items.put((False, None))

    threading.Thread(target=read, daemon=True, name="sia-stream").start()
    while True:
        ok, value = items.get()
        if ok:
            yield value
        elif value is None:
            return
        else:
            raise value
