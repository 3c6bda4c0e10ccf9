"""Per-tenant admission limits on CreateJob: how many jobs a tenant may have
active (not yet ended), and how fast it may create them (a token bucket).

Pure and clock-free: the caller passes the time and the tenant's active count
(the state machine's `active_by_tenant` plus creates accepted but not yet in
it), so the check is exact under concurrent creates. A refusal is
RESOURCE_EXHAUSTED naming the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from sia_grpc.api.errors import ApiError

__all__ = ["TenantLimits", "TokenBucket"]


@dataclass
class TokenBucket:
    """`rate` tokens a second up to `burst`; starts full."""

    rate: float
    burst: float
    tokens: float = -1.0
    last: float | None = None

    def take(self, now: float) -> float:
        """Take one token: 0 if there was one, else the seconds until there is."""
        if self.tokens < 0:
            self.tokens = self.burst
        if self.last is not None and now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now if self.last is None else max(self.last, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass
class TenantLimits:
    """`max_active_jobs` (0: no limit) and `create_rate` per second with bursts of
    `create_burst` (0: no limit), each per tenant."""

    max_active_jobs: int = 0
    create_rate: float = 0.0
    create_burst: int = 0
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_active_jobs < 0 or self.create_rate < 0 or self.create_burst < 0:
            raise ValueError("limits must be >= 0")
        if self.create_rate > 0 and self.create_burst < 1:
            self.create_burst = max(1, int(self.create_rate))

    def admit(self, tenant: str, active: int, now: float) -> None:
        """Raise RESOURCE_EXHAUSTED if `tenant` may not create a job now."""
        who = f"tenant {tenant!r}" if tenant else "the default tenant"
        if self.max_active_jobs and active >= self.max_active_jobs:
            raise ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"max_active_jobs: {who} has {active} active jobs, the limit is "
                           f"{self.max_active_jobs}; wait for one to end or cancel one",
                           reason="MAX_ACTIVE_JOBS")
        if self.create_rate:
            bucket = self._buckets.setdefault(
                tenant, TokenBucket(self.create_rate, float(self.create_burst)))
            wait = bucket.take(now)
            if wait > 0:
                raise ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"create_rate: {who} may create {self.create_rate:g} jobs a "
                               f"second (bursts of {self.create_burst}); retry in "
                               f"{wait:.2f} s", reason="CREATE_RATE")
