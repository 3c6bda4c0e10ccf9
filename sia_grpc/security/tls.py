"""TLS plumbing shared by the controller, the node agent and the client SDK."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import grpc

__all__ = ["channel_credentials", "is_loopback", "read_pem", "server_credentials",
           "split_host_port"]

PemSource = str | Path | bytes


def read_pem(source: PemSource | None, what: str = "PEM") -> bytes | None:
    """PEM bytes from a path, or `source` itself when it is already bytes."""
    if source is None or source == "":
        return None
    if isinstance(source, bytes):
        return source
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what}: cannot read {source}: {exc.strerror or exc}") from None


def split_host_port(address: str) -> tuple[str, str]:
    """("::1", "50051") for "[::1]:50051"; ("0.0.0.0", "50051") for "0.0.0.0:50051"."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT names only this machine: 127.0.0.0/8, ::1 or localhost.
    An empty host, 0.0.0.0 and [::] are every interface: not loopback."""
    host = split_host_port(address)[0].lower()
    if host in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_credentials(cert: PemSource, key: PemSource, client_ca: PemSource | None = None,
                       *, require_client_cert: bool = False) -> grpc.ServerCredentials:
    """TLS with the server's certificate; with `require_client_cert`, mutual TLS:
    every client must present a certificate signed by `client_ca`."""
    pair = (read_pem(key, "tls_key"), read_pem(cert, "tls_cert"))
    roots = read_pem(client_ca, "tls_client_ca") if require_client_cert else None
    return grpc.ssl_server_credentials([pair], root_certificates=roots,
                                       require_client_auth=require_client_cert)


def channel_credentials(ca: PemSource | None, cert: PemSource | None = None,
                        key: PemSource | None = None) -> grpc.ChannelCredentials:
    """TLS to a server whose certificate `ca` signed (None: the system's roots), with
    a client certificate when `cert` and `key` are given."""
    if (cert is None) != (key is None):
        raise ValueError("client certificate: give both the certificate and its key")
    return grpc.ssl_channel_credentials(root_certificates=read_pem(ca, "ca"),
                                        private_key=read_pem(key, "key"),
                                        certificate_chain=read_pem(cert, "cert"))
