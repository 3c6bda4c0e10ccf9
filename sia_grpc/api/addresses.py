"""Controller addresses as clients and node agents give them: parsing one (`normalize`)
and resolving the list to dial (`expand`). Shared by the SDK's failover
(`client/failover.py`: which address a client talks to now) and the node agent, which
both follow a controller pair and its leader.

One host name with several DNS records (A and AAAA: a headless Service, a
round-robin name) counts as several addresses, one per record, resolved before the
first call and again once every address known has failed (a replaced pod has a new
IP). A name with one record, an IP literal and gRPC's own schemes (`unix:`, ...)
are dialled as given. With TLS, a channel to a record's IP verifies the certificate
against the host name the user gave (the channel's `grpc.default_authority`), since
the certificate names the DNS name or Service, not the pods' IPs.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
from collections.abc import Callable
from typing import cast

__all__ = ["Resolve", "expand", "host_name", "normalize", "resolve", "split_targets"]

# gRPC's own address schemes, dialled as given (no DNS).
_AS_IS = ("unix:", "unix-abstract:", "vsock:", "ipv4:", "ipv6:")

Resolve = Callable[[str, int], list[tuple[str, int]]]
"""(host, port) -> the (IP, port) pairs to dial; raises OSError when it cannot."""


def split_targets(target: str) -> list[str]:
    """"a:1,b:2" -> ["a:1", "b:2"] (one address: itself)."""
    return [t.strip() for t in target.split(",") if t.strip()] or [target]


def resolve(host: str, port: int) -> list[tuple[str, int]]:
    """`host`'s A and AAAA records (getaddrinfo, in its order, each once). Blocking."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # (a host's addresses are AF_INET or AF_INET6: (host, port, ...), never AF_UNIX's)
    return list(dict.fromkeys((cast(str, info[4][0]), cast(int, info[4][1]))
                              for info in found))


def normalize(target: str, field: str = "target") -> str:
    """One address as this module dials it: `dns:///HOST:PORT` (gRPC's form) as
    HOST:PORT; gRPC's `unix:`, `ipv4:`, ... as given. ValueError naming `field`
    for what this module cannot resolve itself (a DNS server of its own, xds:, http://)."""
    if target.startswith(_AS_IS):
        return target
    if target.startswith("dns:"):
        rest = target.removeprefix("dns:")
        if rest.startswith("//"):  # dns://[DNS SERVER]/HOST:PORT
            server, _, rest = rest[2:].partition("/")
            if server or not rest:
                raise ValueError(f"{field}: {target!r}: a DNS server of its own (dns://SERVER/) "
                                 f"is not supported; give dns:///HOST:PORT or HOST:PORT")
        return rest
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/", target):
        raise ValueError(f"{field}: {target!r}: unsupported scheme; give HOST:PORT or "
                         f"dns:///HOST:PORT (several: comma-separated)")
    return target


def host_name(address: str) -> tuple[str, int] | None:
    """(host, port) of a HOST:PORT whose host is a name DNS may expand; None for an
    IP literal, a scheme, or no port."""
    host, sep, port = address.rpartition(":")
    if address.startswith(_AS_IS) or not (sep and host and port.isdigit()):
        return None
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host.strip("[]"))
        return None
    return host, int(port)


def expand(targets: list[str], resolve: Resolve = resolve) -> dict[str, str | None]:
    """The addresses to dial for `targets`, each -> the host name to verify its TLS
    certificate against (None: its own host). A name with several records gives one
    IP:PORT per record; anything else (one record, none now, an IP) stays itself:
    gRPC resolves a name again on each connection. Blocking: in async code call it
    off the event loop."""
    found: dict[str, str | None] = {}
    for target in targets:
        named, records = host_name(target), []
        if named is not None:
            with contextlib.suppress(OSError):  # socket.gaierror: not known now
                records = resolve(*named)
        if named is not None and len(records) > 1:
            found.update((_join(ip, port), named[0]) for ip, port in records)
        else:
            found.setdefault(target, None)
    return found


def _join(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
