"""sia-grpc: heterogeneity-aware, goodput-optimised DL cluster scheduling (Sia)."""
__version__ = "0.1.0"
