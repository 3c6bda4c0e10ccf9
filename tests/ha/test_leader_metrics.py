"""The metrics an operator watches on a controller pair (docs/operations.md, "What to
watch"): `sia.leader` is 1 on the leader and 0 on the standby, and a leader whose
lease renewals fail counts them in `sia.lease.renew_failures` (by reason) before it
steps down, when the gauges swap."""

from __future__ import annotations

import contextlib

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from test_ha_inprocess import config, leaders, until

from sia_grpc.controller.shell.server import Controller
from sia_grpc.controller.stores import StoreError
from sia_grpc.observability import RENEW_FAILURES, setup_telemetry


def points(reader: InMemoryMetricReader, name: str) -> dict[str, float]:
    """{reason (or ""): value} of one metric, as the reader collects it now."""
    out: dict[str, float] = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for p in metric.data.data_points:
                        out[str(p.attributes.get("reason", ""))] = p.value
    return out


@contextlib.asynccontextmanager
async def measured_pair(dsn: str):
    readers = {}
    controllers = []
    for _ in range(2):
        reader = InMemoryMetricReader()
        c = Controller(config(dsn), telemetry=setup_telemetry(metric_reader=reader, env={}))
        readers[c] = reader
        controllers.append(c)
    try:
        for c in controllers:
            await c.start()
        yield controllers, readers
    finally:
        for c in controllers:
            await c.close(grace=0)


async def test_the_leader_gauge_and_renew_failures(postgres_dsn):
    async with measured_pair(postgres_dsn) as ((a, b), readers):
        (leader,) = await until(lambda: leaders(a, b), "a leader")
        standby = b if leader is a else a
        assert points(readers[leader], "sia.leader") == {"": 1}
        assert points(readers[standby], "sia.leader") == {"": 0}
        # Every reason's series exists, at 0, before the first failure (for alerts).
        assert points(readers[leader], "sia.lease.renew_failures") == \
            dict.fromkeys(RENEW_FAILURES, 0)

        def unreachable(*args, **kw):
            raise StoreError("store: cannot renew: connection refused")

        leader._store.renew = unreachable  # the database is away, for this one only
        await until(lambda: standby.leading, "the standby to take over")
        await until(lambda: not leader.leading, "the old leader to step down")
        failures = points(readers[leader], "sia.lease.renew_failures")
        assert failures["error"] >= 1, failures
        assert points(readers[leader], "sia.leader") == {"": 0}
        assert points(readers[standby], "sia.leader") == {"": 1}
