from __future__ import annotations

import grpc
import pytest

from sia_grpc.api.errors import ApiError
from sia_grpc.controller.shell.limits import TenantLimits, TokenBucket


def test_bucket_allows_a_burst_then_the_rate():
    b = TokenBucket(rate=2.0, burst=3)
    assert [b.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(0.0) == pytest.approx(0.5)
    assert b.take(0.5) == 0.0  # one token refilled
    assert b.take(0.5) > 0
    assert b.take(100.0) == 0.0 and b.tokens == pytest.approx(2.0)  # capped at the burst


def test_active_limit_is_per_tenant_and_names_the_limit():
    lim = TenantLimits(max_active_jobs=2)
    lim.admit("a", 1, 0.0)
    with pytest.raises(ApiError) as err:
        lim.admit("a", 2, 0.0)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.message.startswith("max_active_jobs:") and "'a'" in err.value.message
    lim.admit("b", 0, 0.0)


def test_create_rate_is_per_tenant():
    lim = TenantLimits(create_rate=1.0, create_burst=2)
    lim.admit("a", 0, 0.0)
    lim.admit("a", 0, 0.0)
    with pytest.raises(ApiError, match="create_rate: tenant 'a'.*retry in 1.00 s"):
        lim.admit("a", 0, 0.0)
    lim.admit("b", 0, 0.0)  # another tenant's bucket is full
    lim.admit("a", 0, 1.0)


def test_no_limits_admit_everything():
    lim = TenantLimits()
    for k in range(1000):
        lim.admit("a", k, 0.0)
    with pytest.raises(ValueError):
        TenantLimits(max_active_jobs=-1)


@pytest.mark.timeout(60)
async def test_controller_enforces_the_per_tenant_limits_over_grpc():
    from dataclasses import replace

    from sia_grpc.api import pb
    from sia_grpc.client import AsyncSiaClient
    from sia_grpc.controller.config import ConfigError, ControllerConfig
    from sia_grpc.testing.localcluster import LocalCluster

    def spec(name: str, tenant: str) -> pb.JobSpec:
        return pb.JobSpec(name=name, application="cifar10", tenant=tenant,
                          adaptivity=pb.ADAPTIVITY_ADAPTIVE)

    config = replace(ControllerConfig(listen="127.0.0.1:0", db_path=":memory:"),
                     max_active_jobs=2)
    async with LocalCluster({}, config=config) as lc, AsyncSiaClient(lc.target) as client:
        first = await client.submit(spec("a1", "team-a"))
        await client.submit(spec("a2", "team-a"))
        with pytest.raises(ApiError) as err:
            await client.submit(spec("a3", "team-a"))
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_active_jobs" in err.value.message
        await client.submit(spec("b1", "team-b"))  # another tenant is not affected
        await first.cancel()
        await client.submit(spec("a3", "team-a"))  # an ended job frees a place
        names = sorted([j.spec.name async for j in client.list()])
    assert names == ["a1", "a2", "a3", "b1"]
    with pytest.raises(ConfigError, match="create_rate"):
        ControllerConfig(create_rate=-1.0)
