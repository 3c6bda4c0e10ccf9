"""Checkpoint files: one per generation, written atomically, newest complete wins.

`<dir>/ckpt-gen<generation>.pt` is written as a temporary file in the same
directory (`.ckpt-gen<g>.pt.tmp-<pid>`), flushed and fsynced, renamed over the
final name and the directory fsynced, so a reader sees either the previous
complete file or the new complete one, never a partial one. Periodic
checkpoints of one generation replace each other. Restore takes the newest
generation (not after the reader's own) whose file loads; temporary files are
never candidates.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

__all__ = ["checkpoint_path", "list_checkpoints", "load_checkpoint", "newest_loadable",
           "prune_checkpoints", "save_atomic"]

LOG = logging.getLogger(__name__)
_NAME = re.compile(r"^ckpt-gen(\d+)\.pt$")


def checkpoint_path(directory: str | os.PathLike, generation: int) -> Path:
    return Path(directory) / f"ckpt-gen{int(generation)}.pt"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(obj: Any, path: str | os.PathLike) -> float:
    """torch.save `obj` to `path` atomically; returns the seconds it took."""
    import torch

    t0 = time.perf_counter()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)
    return time.perf_counter() - t0


def list_checkpoints(directory: str | os.PathLike,
                     max_generation: int | None = None) -> list[tuple[int, Path]]:
    """(generation, path) of the complete checkpoints, newest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_file():
            g = int(m.group(1))
            if max_generation is None or g <= max_generation:
                found.append((g, p))
    return sorted(found, reverse=True)


def load_checkpoint(path: str | os.PathLike) -> dict:
    import torch

    # Our own file, holding optimizer and user states of any picklable kind.
    obj = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(obj, dict) or "sia" not in obj:
        raise ValueError(f"{path} is not a sia_grpc.train checkpoint")
    return obj


def newest_loadable(directory: str | os.PathLike, max_generation: int | None = None
                    ) -> tuple[int, Path, dict] | None:
    """The newest checkpoint that loads (skipping damaged ones), or None."""
    for g, p in list_checkpoints(directory, max_generation):
        try:
            return g, p, load_checkpoint(p)
        except Exception as e:  # a damaged file: fall back to an older one
            LOG.warning("skipping unreadable checkpoint %s: %s", p, e)
    return None


def prune_checkpoints(directory: str | os.PathLike, keep: int = 2,
                      generation: int | None = None) -> None:
    """Remove all but the newest `keep` checkpoints, and temporary files of older
    generations than `generation` (left by writers that died)."""
    d = Path(directory)
    for _, p in list_checkpoints(d)[keep:]:
        with contextlib.suppress(OSError):
            p.unlink()
    if generation is None:
        return
    for p in d.glob(".ckpt-gen*.pt.tmp-*"):
        m = re.match(r"^\.ckpt-gen(\d+)\.pt\.tmp-\d+$", p.name)
        if m and int(m.group(1)) < generation:
            with contextlib.suppress(OSError):
                p.unlink()
