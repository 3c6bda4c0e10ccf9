"""TLS plumbing shared by the controller, the node agent and the client SDK."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

__all__ = ["ReloadingCertificates", "TlsProblem", "channel_credentials", "is_loopback",
           "probe_tls", "read_pem", "split_host_port"]

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

        # (the fetcher returns None for "unchanged", as gRPC documents; the stubs say
        # it always returns a configuration)
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(require_client_cert), fetch,  # type: ignore[arg-type]
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


# ---------------------------------------------------------------- diagnosing handshakes

# A client's HTTP/2 preface and an empty SETTINGS frame: a gRPC server answers with
# its SETTINGS once it has accepted the connection (client certificate included).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# OpenSSL verify codes meaning "the certificate is not for this host name or address".
_NAME_MISMATCH = (62, 64)


@dataclass(frozen=True)
class TlsProblem:
    """Why connections to `target` fail at the TLS layer, found by `probe_tls`.

    kind: "tls-required" (the server speaks TLS, the client plaintext), "not-tls"
    (the reverse), "untrusted" (the server's certificate does not verify against
    the client's CA file: `detail` says how), "wrong-name" (it does, but not for the
    host name dialled), "cert-required" (the server wants a client certificate and
    got none), "cert-refused" (it refused the one given).
    """

    kind: str
    target: str
    detail: str = ""

    def hint(self, *, ca: str | None, cert: str | None, ca_flag: str, cert_flags: str,
             issue: str) -> str:
        """One line saying what is wrong and the fix, in the caller's flag names:
        `ca_flag` ("--ca FILE (or SIA_CA)"), `cert_flags` ("--cert FILE --key FILE"),
        `issue` (the `sia certs issue ...` command that makes the right certificate)."""
        return _HINTS[self.kind].format(
            t=self.target, detail=self.detail, ca=ca, cert=cert, ca_flag=ca_flag,
            ca_opt=ca_flag.split()[0], cert_flags=cert_flags, issue=issue,
            expired=_expiry(cert) if self.kind == "cert-refused" else "")


_HINTS = {
    "tls-required": "the controller at {t} speaks TLS and this connection was plaintext: "
                    "pass {ca_flag}",
    "not-tls": "the controller at {t} does not speak TLS (it serves plaintext): drop "
               "{ca_opt}, or start the controller with --tls-cert/--tls-key",
    "wrong-name": "the controller's certificate at {t} is not for this host name ({detail}): "
                  "connect by a name it lists, or reissue it with `sia certs issue DIR "
                  "--controller --hosts HOST`",
    "untrusted": "the controller's certificate at {t} is not signed by the CA in {ca} "
                 "({detail}): give {ca_opt} the CA that signed it",
    "cert-required": "the controller at {t} requires a client certificate: pass {cert_flags} "
                     "(`{issue}` makes one)",
    "cert-refused": "the controller at {t} refused the client certificate {cert}{expired}: "
                    "it must be signed by the controller's --tls-client-ca; issue one with "
                    "`{issue}`",
}


def _expiry(cert: str | None) -> str:
    """" (expired on DATE)" for an expired certificate file, else ""."""
    if cert is None:
        return ""
    try:
        leaf = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    except (OSError, TypeError, ValueError):
        return ""
    end = leaf.not_valid_after_utc
    return f" (expired on {end:%Y-%m-%d})" if end < datetime.datetime.now(datetime.UTC) else ""


def probe_tls(target: str, ca: str | Path | None = None, cert: str | Path | None = None,
              key: str | Path | None = None, *, timeout: float = 3.0,
              name: str | None = None) -> TlsProblem | None:
    """Handshake with the server at `target` (HOST:PORT) as a client with these files
    would (`ca` None: plaintext), and say what fails; None when nothing TLS is wrong
    (including a server that cannot be reached at all). `name`: the host name to
    verify the certificate against, when `target` is an IP it resolved to.

    gRPC reports most of these as a bare UNAVAILABLE ("Socket closed"); a handshake
    of our own can tell them apart. Blocking (up to two connections, each up to
    `timeout` seconds): call it from a thread in async code.
    """
    host, port = split_host_port(target)
    try:
        _handshake(host, port, _context(None), timeout)
        speaks_tls = True
    except _Unreachable:  # refused, no route: not a question of TLS
        return None
    except OSError:  # ssl.SSLError included: no TLS handshake possible
        speaks_tls = False
    if ca is None:
        return TlsProblem("tls-required", target) if speaks_tls else None
    if not speaks_tls:
        return TlsProblem("not-tls", target)
    try:
        ctx = _context(ca, cert, key)
    except (OSError, ValueError):  # unusable files: reported where they are read
        return None
    try:
        answer = _handshake(host, port, ctx, timeout, name)
    except _Unreachable:
        return None
    except ssl.SSLCertVerificationError as err:
        kind = "wrong-name" if err.verify_code in _NAME_MISMATCH else "untrusted"
        return TlsProblem(kind, target, err.verify_message or str(err))
    except OSError:  # ssl.SSLError included: refused in the handshake (TLS 1.2)
        answer = b""
    if answer:
        return None
    return TlsProblem("cert-refused" if cert else "cert-required", target)


class _Unreachable(Exception):
    pass


def _context(ca: str | Path | None, cert: str | Path | None = None,
             key: str | Path | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca is None:  # only: does it speak TLS at all?
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.load_verify_locations(cafile=str(ca))
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    ctx.set_alpn_protocols(["h2"])  # as gRPC: a server may insist on it
    return ctx


def _handshake(host: str, port: str, ctx: ssl.SSLContext, timeout: float,
               name: str | None = None) -> bytes:
    """The server's first bytes after a TLS handshake and our HTTP/2 preface: b"" when
    it hung up, as a server refusing the client certificate does under TLS 1.3.
    Raises _Unreachable (no TCP connection) or the handshake's own error."""
    try:
        raw = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as err:
        raise _Unreachable(str(err)) from None
    # Over memory BIOs, not `ctx.wrap_socket`: the socket stays ours and is closed
    # whatever happens. wrap_socket takes it over first, and on a connection the peer
    # reset at once (a controller stopping) raises without closing what it made: an
    # SSLSocket nobody can close, a ResourceWarning when it is collected (CI).
    with raw:
        into, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(into, out, server_hostname=name or host)
        _pump(raw, into, out, tls.do_handshake)
        try:
            _pump(raw, into, out, lambda: tls.write(_H2_PREFACE))
            return _pump(raw, into, out, lambda: tls.read(64))
        except OSError:  # ssl.SSLError included: an alert, a close or a reset after it
            return b""


def _pump(raw: socket.socket, into: ssl.MemoryBIO, out: ssl.MemoryBIO, step):
    """`step()`, a TLS operation over the BIOs, run to its end over `raw`: what it
    writes is sent, what it waits for is read. The peer's hang-up is the BIO's EOF
    (the TLS object then raises its SSLError)."""
    while True:
        try:
            result, done = step(), True
        except ssl.SSLWantReadError:
            result, done = None, False
        if pending := out.read():
            raw.sendall(pending)
        if done:
            return result
        if into.eof:  # (it wants more after the hang-up: never expected of OpenSSL)
            raise ssl.SSLEOFError("the server closed the connection in the TLS handshake")
        data = raw.recv(16384)
        if data:
            into.write(data)
        else:
            into.write_eof()
