"""Ending the agent's own asyncio tasks."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel"]


async def cancel(*tasks: asyncio.Task[Any]) -> None:
    """Cancel `tasks` and wait until all have ended (their errors dropped)."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
