"""SiaClient and AsyncSiaClient, and their job handles, have one API: the same public
methods with the same parameters, each `async` (or an async iterator) exactly where
its blocking twin does I/O, so that the two cannot drift apart again."""

from __future__ import annotations

import inspect

import pytest

from sia_grpc.client import AsyncJobHandle, AsyncSiaClient, JobHandle, SiaClient

PAIRS = [(SiaClient, AsyncSiaClient), (JobHandle, AsyncJobHandle)]
NO_IO = {"handle"}  # a local object: no call, so a plain method in both


def public(cls: type) -> dict[str, object]:
    return {name: getattr(cls, name) for name in dir(cls)
            if not name.startswith("_") and callable(getattr(cls, name))}


def parameters(fn: object) -> list[tuple]:
    """Each parameter's name, kind, default and annotation (a string here)."""
    return [(p.name, p.kind, p.default, p.annotation)
            for p in inspect.signature(fn).parameters.values()]


def as_async(annotation: str) -> str:
    """The async twin's return annotation for a blocking method's."""
    return annotation.replace("Iterator[", "AsyncIterator[").replace("JobHandle", "AsyncJobHandle")


@pytest.mark.parametrize("blocking, aio", PAIRS, ids=lambda cls: cls.__name__)
def test_both_have_the_same_methods_with_the_same_parameters(blocking, aio):
    assert sorted(public(blocking)) == sorted(public(aio))
    assert parameters(blocking) == parameters(aio)  # the constructors
    for name, method in public(blocking).items():
        assert parameters(method) == parameters(getattr(aio, name)), name


@pytest.mark.parametrize("blocking, aio", PAIRS, ids=lambda cls: cls.__name__)
def test_the_async_twin_awaits_exactly_where_the_blocking_one_does_io(blocking, aio):
    for name, method in public(blocking).items():
        twin = getattr(aio, name)
        returns = inspect.signature(method).return_annotation
        assert inspect.signature(twin).return_annotation == as_async(returns), name
        assert not inspect.iscoroutinefunction(method), name
        streams = returns.startswith("Iterator[")
        assert inspect.iscoroutinefunction(twin) == (not streams and name not in NO_IO), name
        assert method.__doc__ and twin.__doc__, f"{name}: undocumented"


def test_the_clients_have_every_call_of_the_api():
    assert sorted(public(SiaClient)) == [
        "cancel", "close", "cluster", "delete", "drain", "events", "forget_node", "get",
        "handle", "list", "queues", "rounds", "submit", "undrain", "watch", "watch_events",
        "watch_rounds"]
    assert sorted(public(JobHandle)) == ["cancel", "job", "status", "wait", "watch"]
