"""sia-grpc: heterogeneity-aware, goodput-optimised DL cluster scheduling (Sia)."""

import importlib.metadata

try:  # the installed distribution's version: one place (pyproject.toml)
    __version__ = importlib.metadata.version("sia-grpc")
except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
    __version__ = "0+unknown"
