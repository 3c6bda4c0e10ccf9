"""Where the agent's next stream goes: the controller addresses (`AgentConfig.controllers`
resolved with api/addresses.py's `expand`), tried in turn, and the leader a standby
names."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from sia_grpc.api.addresses import Resolve, expand

__all__ = ["ControllerTargets"]


class ControllerTargets:
    """The controller addresses, each with the name to verify its certificate against,
    resolved before the first stream and again once every one has failed; and which
    one the next stream goes to (`address`)."""

    def __init__(self, controllers: tuple[str, ...], resolve: Resolve, log: Any) -> None:
        self._controllers = controllers
        self._resolve = resolve
        self._log = log
        self._names: dict[str, str | None] = dict.fromkeys(controllers)
        self._addresses = list(self._names)
        self._stale = True
        self._target = 0  # index into _addresses: where the next stream goes

    @property
    def address(self) -> str:
        """Where the next stream goes."""
        return self._addresses[self._target]

    def name(self, address: str) -> str | None:
        """The host name `address` was resolved from, if it was (for its certificate)."""
        return self._names.get(address)

    def next(self) -> None:
        """The next stream goes to the next controller address (one: the same);
        after the last, the addresses are resolved again (a replaced pod's new IP)."""
        self._target = (self._target + 1) % len(self._addresses)
        self._stale = self._target == 0

    async def refresh(self) -> None:
        """Resolve the controller addresses if due, off the event loop."""
        if not self._stale:
            return
        now = self._addresses[self._target]
        found = await asyncio.to_thread(expand, list(self._controllers), self._resolve)
        self._names, self._addresses, self._stale = found, list(found), False
        self._target = self._addresses.index(now) if now in found else 0

    def follow_leader(self, exc: grpc.aio.AioRpcError) -> bool:
        """A standby's NOT_LEADER naming one of our addresses: go there next, now.
        (Only ours: with mutual TLS agents use other ports than the clients' address
        a standby names; then the next address is tried, with the backoff.)"""
        from sia_grpc.api.errors import ApiError

        err = ApiError.from_rpc_error(exc)
        if err.reason != "NOT_LEADER":
            return False
        leader, addresses = err.metadata.get("leader", ""), self._addresses
        if leader not in addresses or addresses.index(leader) == self._target:
            return False
        self._log.info("controller is a standby: to the leader", standby=addresses[self._target],
                       leader=leader)
        self._target = addresses.index(leader)
        return True
