"""sia-grpc: heterogeneity-aware, goodput-optimised DL cluster scheduling (Sia)."""

import importlib.metadata as _metadata
import os as _os

# gRPC core writes INFO lines of its own to stderr (e.g. "ssl_transport_security.cc
# ... Handshake failed" for every bad TLS client), outside our log format and in
# front of the CLI's one-line errors. Read once, when gRPC's core starts: set here,
# before any module of ours imports grpc. An explicit GRPC_VERBOSITY wins.
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

try:  # the installed distribution's version: one place (pyproject.toml)
    __version__ = _metadata.version("sia-grpc")
except _metadata.PackageNotFoundError:  # run from a checkout, not installed
    __version__ = "0+unknown"
