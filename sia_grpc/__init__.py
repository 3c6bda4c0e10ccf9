"""sia-grpc: heterogeneity-aware, goodput-optimised DL cluster scheduling (Sia)."""

import os as _os

# gRPC core writes INFO lines of its own to stderr (e.g. "ssl_transport_security.cc
# ... Handshake failed" for every bad TLS client), outside our log format and in
# front of the CLI's one-line errors. Read once, when gRPC's core starts: set here,
# before any module of ours imports grpc. An explicit GRPC_VERBOSITY wins.
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")



def __getattr__(name: str) -> str:
    """`__version__`, the installed distribution's (one place: pyproject.toml), read
    when first asked for: importlib.metadata takes 70 ms to import, which every
    `sia-slurm env` (at the start of every Slurm job the bridge runs) would pay."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib.metadata

    try:
        version = importlib.metadata.version("sia-grpc")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        version = "0+unknown"
    globals()["__version__"] = version
    return version
