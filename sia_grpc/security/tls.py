"""TLS plumbing shared by the controller, the node agent and the client SDK."""

from __future__ import annotations

import ipaddress
import os
import threading
from pathlib import Path

import grpc
import structlog
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

__all__ = ["ReloadingCertificates", "channel_credentials", "is_loopback", "read_pem",
           "split_host_port"]

log = structlog.get_logger()

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


class ReloadingCertificates:
    """The server's certificate, key and client CA, re-read when their files change.

    Each `credentials()` asks gRPC to call a fetcher before every new handshake; the
    fetcher stats the files (cheap) and re-reads them only when mtime, size, inode or
    ctime changed. A set that fails to load or whose key does not match the
    certificate is logged once and the last good one stays in force. Connections
    already open keep their TLS session.
    """

    _NAMES = ("tls_cert", "tls_key", "tls_client_ca")

    def __init__(self, cert: PemSource, key: PemSource,
                 client_ca: PemSource | None = None) -> None:
        self._sources = (cert, key, client_ca)
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._pems = self._load()  # at startup a bad file raises ValueError
        self._generation = 0  # bumped on each successful reload

    def credentials(self, *, require_client_cert: bool = False) -> grpc.ServerCredentials:
        """Server credentials that follow the files; with `require_client_cert`,
        mutual TLS against the (reloaded) client CA."""
        if require_client_cert and self._pems[2] is None:
            raise ValueError("tls_client_ca: needed to require client certificates")
        seen = self._generation  # per credentials: each port's TLS context is separate

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            nonlocal seen
            try:
                self._refresh()
                with self._lock:
                    if seen == self._generation:
                        return None
                    seen = self._generation
                    return self._configuration(require_client_cert)
            except Exception as exc:  # never into gRPC's core: keep the last config
                log.warning("TLS certificates not reloaded", error=repr(exc))
                return None

        return grpc.dynamic_ssl_server_credentials(
            self._configuration(require_client_cert), fetch,
            require_client_authentication=require_client_cert)

    def _configuration(self, with_ca: bool) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = self._pems
        return grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=ca if with_ca else None)

    def _stat(self) -> tuple:
        def one(source: PemSource | None) -> tuple | None:
            if source is None or isinstance(source, bytes) or source == "":
                return None
            try:
                st = os.stat(source)
            except OSError as exc:
                return (exc.errno,)
            return st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev
        return tuple(one(s) for s in self._sources)

    def _load(self) -> tuple[bytes, bytes, bytes | None]:
        """Read and check the three PEMs; ValueError naming the file if unusable."""
        cert, key, ca = (read_pem(s, n) for s, n in zip(self._sources, self._NAMES,
                                                           strict=True))
        if not cert or not key:
            raise ValueError("tls_cert/tls_key: both are needed")
        try:
            leaf = x509.load_pem_x509_certificate(cert)
        except ValueError as exc:
            raise ValueError(f"tls_cert: not a PEM certificate: {exc}") from None
        try:
            private = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise ValueError(f"tls_key: not an unencrypted PEM private key: {exc}") from None
        spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        if private.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
            raise ValueError("tls_key: does not match the certificate in tls_cert")
        if ca is not None:
            try:
                x509.load_pem_x509_certificates(ca)
            except ValueError as exc:
                raise ValueError(f"tls_client_ca: not PEM certificates: {exc}") from None
        return cert, key, ca

    def _refresh(self) -> None:
        """Reload if the files changed since the last look (successful or not)."""
        with self._lock:
            stamp = self._stat()
            if stamp == self._stamp:
                return
            self._stamp = stamp  # a bad set is reported once, retried when it changes
            files = {n: str(s) for n, s in zip(self._NAMES, self._sources, strict=True)
                     if s and not isinstance(s, bytes)}
            try:
                pems = self._load()
            except ValueError as exc:
                log.warning("TLS certificates not reloaded; still serving the previous ones",
                            error=str(exc), **files)
                return
            if pems == self._pems:
                return  # touched, not changed
            self._pems = pems
            self._generation += 1
        expires = x509.load_pem_x509_certificate(pems[0]).not_valid_after_utc
        log.info("TLS certificates reloaded", expires=expires.isoformat(), **files)


def channel_credentials(ca: PemSource | None, cert: PemSource | None = None,
                        key: PemSource | None = None) -> grpc.ChannelCredentials:
    """TLS to a server whose certificate `ca` signed (None: the system's roots), with
    a client certificate when `cert` and `key` are given."""
    if (cert is None) != (key is None):
        raise ValueError("client certificate: give both the certificate and its key")
    return grpc.ssl_channel_credentials(root_certificates=read_pem(ca, "ca"),
                                        private_key=read_pem(key, "key"),
                                        certificate_chain=read_pem(cert, "cert"))
