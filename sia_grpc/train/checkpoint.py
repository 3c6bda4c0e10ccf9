"""Checkpoint files: one per generation, written atomically, newest complete wins.

`<dir>/ckpt-gen<generation>.pt` is written as a temporary file in the same
directory (`.ckpt-gen<g>.pt.tmp-<pid>`), flushed and fsynced, renamed over the
final name and the directory fsynced, so a reader sees either the previous
complete file or the new complete one, never a partial one. Periodic
checkpoints of one generation replace each other. Restore takes the newest
generation (not after the reader's own) whose file loads; temporary files are
never candidates.

Loading never runs code from the file. The folder is writable by the job and
whatever else can reach it, so a planted `ckpt-gen<N>.pt` must not be able to
execute anything in the next worker: files are read with `weights_only=True`,
allowing torch's defaults (tensors, state dicts, containers, numbers, strings)
and, only for the duration of the load, numpy arrays, numbers and dtypes
(`_allowed_globals`: a numpy RNG state or array inside a registered state).
The library itself writes nothing else: the "sia" entry is plain numbers,
strings and lists, and every registered object contributes its state_dict.

Two kinds of bad files, told apart on purpose:

* damaged (truncated, not a torch file, not ours): skipped with a warning, and
  restore falls back to the next older checkpoint, as a crash mid-write or a
  stray file needs;
* refused (it names a global outside the allow-list, which the library never
  writes): `CheckpointRefused`, naming the file and the global. This is a
  planted file, so restore fails loudly instead of quietly resuming an older
  checkpoint: a silent fallback would hide the attack and lose the newest work.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import re
import time
from pathlib import Path
from typing import Any

__all__ = ["CheckpointRefused", "checkpoint_path", "list_checkpoints", "load_checkpoint",
           "newest_loadable", "prune_checkpoints", "save_atomic"]

LOG = logging.getLogger(__name__)
_NAME = re.compile(r"^ckpt-gen(\d+)\.pt$")
# What torch's weights-only unpickler says when the file asks for something it
# does not allow (as opposed to bytes it cannot parse): the offending name.
_POLICY = re.compile(r"GLOBAL (?P<g>[\w.]+)|unrecognized function (?P<f>\S+)"
                     r"|Can only (?:create new object|build).*?but got (?P<c>\S+)")


class CheckpointRefused(ValueError):
    """A checkpoint file holds objects the loader does not allow (a planted file)."""

    def __init__(self, path: str | os.PathLike, offending: str) -> None:
        self.path, self.offending = str(path), offending
        super().__init__(f"checkpoint {self.path} refused: it holds objects the loader does "
                         f"not allow ({offending}). Nothing in it ran. The library's own "
                         "states never hold those: the file was planted, or a registered "
                         "state_dict holds more than tensors, containers, numbers, strings "
                         "and numpy arrays. Remove it to restore from an older checkpoint")


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


@functools.cache
def _allowed_globals() -> tuple[Any, ...]:
    """Beyond torch's weights-only defaults: numpy arrays, scalars and numeric dtypes
    (e.g. `numpy.random.get_state()` in a registered state). Numeric only: an
    object-dtype array could carry arbitrary objects. Python's `random.getstate()`
    and torch RNG states (a uint8 tensor) need nothing extra."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    dtypes = tuple(type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDG")
    out: list[Any] = [np.ndarray, np.dtype, core.multiarray._reconstruct,
                      core.multiarray.scalar, *dict.fromkeys(dtypes)]
    # Files written under numpy 1 name these numpy.core.*: the same functions.
    out += [(core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
            (core.multiarray.scalar, "numpy.core.multiarray.scalar")]
    return tuple(out)


def _allowed_names() -> set[str]:
    """The dotted names a file may reference: torch's weights-only defaults and ours."""
    import torch

    try:  # private, but what torch.serialization.get_unsafe_globals_in_checkpoint uses
        names = set(torch._weights_only_unpickler._get_allowed_globals())
    except Exception:  # an API change: then every global of a file that failed is suspect
        names = set()
    for g in _allowed_globals():
        names.add(g[1] if isinstance(g, tuple) else f"{g.__module__}.{g.__qualname__}")
    return names


def _foreign_global(path: str | os.PathLike) -> str | None:
    """A global that the pickle in `path` (a torch zip's data.pkl, or a bare pickle)
    names outside the allow-list, found by reading its opcodes (nothing runs); None
    when there is none or the bytes cannot be read. For files that fail to load for
    another reason first (a bare protocol-4 pickle, an opcode torch does not take)."""
    import pickletools
    import zipfile

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                name = next(n for n in z.namelist() if n.rsplit("/", 1)[-1] == "data.pkl")
                data = z.read(name)
        else:
            data = Path(path).read_bytes()
    except Exception:
        return None
    allowed = _allowed_names()
    pushed: list[str | None] = []
    memo: dict[int, str | None] = {}
    arg: Any  # (the opcode's argument: a str for GLOBAL, an int for PUT and GET, ...)
    with contextlib.suppress(Exception):  # damaged bytes end the scan, not the caller
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("GLOBAL", "INST"):
                found = arg.replace(" ", ".")
            elif op.name == "STACK_GLOBAL":  # module and name are the last two pushes
                found = ".".join(map(str, pushed[-2:]))
            else:
                if op.name == "MEMOIZE":
                    memo[len(memo)] = pushed[-1] if pushed else None
                elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                    memo[arg] = pushed[-1] if pushed else None
                elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                    pushed.append(memo.get(arg))
                else:
                    pushed.append(arg if isinstance(arg, str) else None)
                continue
            if found not in allowed:
                return found
    return None


def load_checkpoint(path: str | os.PathLike) -> dict:
    """The checkpoint at `path`, loaded without running anything in it;
    CheckpointRefused if it asks for objects outside the allow-list, ValueError
    if it is no sia_grpc.train checkpoint, other errors if it is damaged."""
    import torch

    try:
        # Allowed for this load only, not for every torch.load of the process.
        with torch.serialization.safe_globals(list(_allowed_globals())):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        # torch names the global it refused; a file it could not even parse that far
        # is read statically. Neither: damaged bytes, not a planted object.
        m = _POLICY.search(str(e)) if isinstance(e, pickle.UnpicklingError) else None
        offending = (m.group("g") or m.group("f") or m.group("c")) if m else None
        offending = offending or _foreign_global(path)
        if offending:
            raise CheckpointRefused(path, offending) from None
        raise
    if not isinstance(obj, dict) or "sia" not in obj:
        raise ValueError(f"{path} is not a sia_grpc.train checkpoint")
    return obj


def newest_loadable(directory: str | os.PathLike, max_generation: int | None = None
                    ) -> tuple[int, Path, dict] | None:
    """The newest checkpoint that loads (skipping damaged ones), or None.
    CheckpointRefused (logged) when a newer file than any loadable one is refused."""
    for g, p in list_checkpoints(directory, max_generation):
        try:
            return g, p, load_checkpoint(p)
        except CheckpointRefused as e:  # planted: fail, never fall back past it
            LOG.error("%s", e)
            raise
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
