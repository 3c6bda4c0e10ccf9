"""What one node agent is configured with (`AgentConfig`, its checks and its channel
to the controller), the error for a configuration that cannot work, and the backoff
between reconnects."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import grpc

from sia_grpc import __version__
from sia_grpc.api.addresses import normalize

__all__ = ["AgentConfig", "AgentConfigError", "full_jitter_backoff", "issue_command"]


def issue_command(node_id: str) -> str:
    """The command that issues `node_id` its client certificate (named in hints)."""
    return f"sia certs issue DIR --agent {node_id}"


class AgentConfigError(Exception):
    """The agent cannot work as configured (e.g. its certificate is refused); the
    message names the fix. `NodeAgent.run()` raises it once the agent has closed."""


def _positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}: must be a positive number, got {value!r}")


@dataclass(frozen=True)
class AgentConfig:
    """What one node agent needs. Times are clock (real) seconds unless named modeled."""

    node_id: str
    # "host:port", or several comma-separated (a controller pair: the agent finds the
    # leader, following a standby's NOT_LEADER answer, else trying the next one); a
    # host name with several DNS records counts as several (api/addresses.py)
    controller: str
    gpu_type: str
    num_gpus: int
    time_scale: float = 1.0  # modeled seconds per real second (modeled workers)
    telemetry_interval_s: float = 2.0
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 10.0
    heartbeat_interval_s: float = 5.0  # only if Registered leaves it unset
    register_timeout_s: float = 10.0  # for the controller's Registered
    # HTTP/2 keepalive: with nothing read for this long the agent pings, and a ping
    # unanswered for as long again ends the stream. Else a partition (no RST, no FIN)
    # leaves the agent writing into a dead TCP connection for many minutes.
    keepalive_s: float = 20.0
    close_grace_s: float = 2.0  # close(): time to flush final JobExits
    agent_version: str = __version__
    # Mutual TLS (docs/security.md): the CA of the controller's certificate, and this
    # node's client certificate (CN or SAN = node_id). Read again on every
    # reconnect, so renewed files are picked up without a restart.
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("node_id: must not be empty")
        for address in self.controllers:  # (normalize: ValueError for dns://SERVER/, xds:)
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"controller: expected HOST:PORT[,HOST:PORT...], got "
                                 f"{self.controller!r}")
        if not self.gpu_type:
            raise ValueError("gpu_type: must not be empty")
        if self.num_gpus < 1:
            raise ValueError(f"num_gpus: must be >= 1, got {self.num_gpus}")
        for name in ("time_scale", "telemetry_interval_s", "backoff_base_s", "backoff_cap_s",
                     "heartbeat_interval_s", "register_timeout_s", "keepalive_s"):
            _positive(name, getattr(self, name))
        if self.backoff_cap_s < self.backoff_base_s:
            raise ValueError("backoff_cap_s: must be >= backoff_base_s")
        if self.close_grace_s < 0:
            raise ValueError("close_grace_s: must be >= 0")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert, tls_key: give both (the client certificate and its key)")
        if self.tls_cert and not self.tls_ca:
            raise ValueError("tls_ca: required with tls_cert (the controller's CA)")
        if self.tls_ca and not self.tls_cert:
            # A TLS controller admits agents only with a client certificate: without
            # one every handshake on its agent port fails ("Socket closed"), for ever.
            raise ValueError(f"tls_cert, tls_key: an agent connecting with TLS needs its "
                             f"client certificate (CN = node id); issue one with "
                             f"`{issue_command(self.node_id)}`")

    @property
    def controllers(self) -> tuple[str, ...]:
        """The controller addresses, in the order tried."""
        return tuple(normalize(a.strip(), "controller") for a in self.controller.split(",")
                     if a.strip()) or ("",)

    def channel(self, address: str | None = None, name: str | None = None) -> grpc.aio.Channel:
        """A new channel to the controller at `address` (the first by default): TLS
        when tls_ca is set, else plaintext. `name`: the host name the controller's
        certificate is verified against when `address` is an IP it resolved to (the
        channel's authority, as in the SDK's `_channel_setup`)."""
        address = address or self.controllers[0]
        ms = max(int(self.keepalive_s * 1000), 1000)  # the controller accepts 1 ping/s
        options: list[tuple[str, int | str]] = [
            ("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
        if name:
            options.append(("grpc.default_authority", name))
        if not self.tls_ca:
            return grpc.aio.insecure_channel(address, options=options)
        from sia_grpc.security.tls import channel_credentials

        return grpc.aio.secure_channel(
            address, channel_credentials(self.tls_ca, self.tls_cert, self.tls_key),
            options=options)


def full_jitter_backoff(attempt: int, *, base: float, cap: float,
                        rng: random.Random | None = None) -> float:
    """Seconds to wait before reconnect `attempt` (0-based): uniform(0, min(cap,
    base·2^attempt)), so agents that lost the controller together do not return
    together."""
    bound = min(cap, base * 2.0 ** min(attempt, 64))
    return (rng or random).uniform(0.0, bound)

