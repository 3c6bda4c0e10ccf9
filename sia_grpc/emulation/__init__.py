"""Emulating applications from the artifact's measurements: what each really does
on each GPU type (step and sync times, gradient statistics, progress). Neutral
ground: the simulator (`sia_grpc.sim`) runs jobs on it, the modeled node agents
(`sia_grpc.nodeagent.modeled`) play workers with it, the torch back-end paces
emulated GPUs by it; none of them imports another for it."""

from sia_grpc.emulation.truth import AppTruth, load_app
from sia_grpc.models.catalogue import SUPPORTED_APPLICATIONS

__all__ = ["SUPPORTED_APPLICATIONS", "AppTruth", "load_app"]
