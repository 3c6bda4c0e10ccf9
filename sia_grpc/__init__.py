"""sia-grpc: heterogeneity-aware, goodput-optimised DL cluster scheduling (Sia)."""

import os as _os

# gRPC core writes INFO lines of its own to stderr (e.g. "ssl_transport_security.cc
# ... Handshake failed" for every bad TLS client), outside our log format and in
# front of the CLI's one-line errors. Read once, when gRPC's core starts: set here,
# before any module of ours imports grpc. An explicit GRPC_VERBOSITY wins.
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

__version__ = "0.1.0"
