"""The controller's store, as the rest of the code imports it: `Store` is the SQLite
back-end (a path); `open_store` picks the back-end from a path or a DSN. The
implementations are in `sia_grpc/controller/stores/`."""

from sia_grpc.controller.stores import (
    LEASE,
    SCHEMA_VERSION,
    Compacted,
    Fenced,
    JobExists,
    JobStore,
    Lease,
    NotFound,
    RequestConflict,
    StoredJob,
    StoreError,
    describe,
    is_postgres,
    open_store,
)
from sia_grpc.controller.stores import SqliteStore as Store

__all__ = ["LEASE", "SCHEMA_VERSION", "Compacted", "Fenced", "JobExists", "JobStore", "Lease",
           "NotFound", "RequestConflict", "Store", "StoreError", "StoredJob", "describe",
           "is_postgres", "open_store"]
