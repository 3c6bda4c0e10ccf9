"""The cgroup filesystem as the agent uses it: reading its files and writing them one
value at a time, and where job cgroups go in a v2 hierarchy (the names probing and
the job cgroups share). cgroups.py's docstring says how it all fits."""

from __future__ import annotations

__all__ = ["V2_DOMAIN", "V2_JOBS", "V2_LEAF", "CgroupError", "read_file", "unique_dirs",
           "write_file"]

V2_DOMAIN = ("cpuset", "memory", "pids")  # the v2 controllers we enable for jobs
V2_JOBS, V2_LEAF = "sia-jobs", "agent"


class CgroupError(RuntimeError):
    """A cgroup could not be created, limited, joined or read."""


def read_file(path: str) -> str:
    with open(path) as f:
        return f.read()


def write_file(path: str, value: str) -> None:
    # Unbuffered: one write(2) per value, as cgroupfs parses each write whole (one pid, one
    # rule). "a" (O_APPEND|O_CREAT) is a no-op on cgroupfs and lets tests use a plain folder.
    try:
        with open(path, "ab", buffering=0) as f:
            f.write(value.encode())
    except OSError as e:
        raise CgroupError(f"cannot write {value!r} to {path}: {e.strerror}") from e


def unique_dirs(dirs: dict[str, str]) -> tuple[str, ...]:
    """The folders of `dirs` (controller -> folder), each once, in order (co-mounted
    controllers, and all of v2's, share one)."""
    return tuple(dict.fromkeys(dirs.values()))
