"""The parts of the torch worker back-end (`sia_grpc.nodeagent.torchbackend`,
where `TorchBackend` ties them together; see its docstring for the map).

Not named `torch`: a package of that name here would read as PyTorch at every
import site (and shadow it wherever this directory lands on sys.path).
"""
