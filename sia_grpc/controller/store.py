"""The controller's store, as the rest of the code imports it: `Store` is the SQLite
back-end (a path); `open_store` picks the back-end from a path or a DSN. The
implementations are in `sia_grpc/controller/stores/`."""

from sia_grpc.controller import stores
from sia_grpc.controller.stores import *  # noqa: F403 (the contract, re-exported)
from sia_grpc.controller.stores import SqliteStore as Store

__all__ = [*stores.__all__, "Store"]
