"""A development certificate authority for the controller and its node agents.

`sia certs init DIR` makes, in DIR:

    ca.crt  ca.key                  the CA (10 years); ca.key signs everything else
    controller.crt  controller.key  server certificate: SANs for --hosts plus
                                    localhost, 127.0.0.1 and ::1
    agent-<node>.crt  agent-<node>.key   one client certificate per --agents name:
                                    CN = node id, DNS SAN = node id, OU = agent
    admin.crt  admin.key            a client certificate with OU = admin, which may
                                    register an agent under any node id (one process
                                    running many modeled agents, load tests)

`sia certs issue DIR --agent NODE | --controller --hosts ... | --admin [NAME]` adds
one more signed by DIR's CA. Keys are EC P-256, written with mode 0600; existing
files are never overwritten (``force=True`` / ``--force`` to replace them).

This is tooling for development and small clusters. A production cluster with its
own PKI (cert-manager, Vault, an enterprise CA) needs none of it: the controller
only wants PEM files, and agents only a client certificate whose CN or DNS SAN is
their node id (see docs/security.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["AGENT_OU", "ADMIN_OU", "Issued", "init_ca", "issue", "load_ca"]

AGENT_OU = "agent"  # organizational unit of an agent certificate
ADMIN_OU = "admin"  # organizational unit of an admin certificate: any node id
ORG = "sia-grpc"
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Issued:
    """The files of one issued certificate."""

    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, mode: int, force: bool) -> None:
    """Write `data` with `mode` from the start (no window in which a key is readable)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise FileExistsError(f"{path}: already exists (use --force to replace it)") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # O_CREAT's mode is masked by the umask; a replaced file kept its own


def _write_pair(directory: Path, stem: str, cert: x509.Certificate,
                key: ec.EllipticCurvePrivateKey, force: bool) -> Issued:
    out = Issued(directory / f"{stem}.crt", directory / f"{stem}.key")
    # Key first: a certificate without its key is useless, the reverse is harmless.
    _write(out.key, key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()), 0o600, force)
    _write(out.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644, force)
    return out


def _name(cn: str, ou: str = "") -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG)]
    if ou:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(h.strip() for h in hosts if h.strip()):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def init_ca(directory: str | Path, *, name: str = "sia development CA", days: int = 3650,
            force: bool = False) -> Issued:
    """A new self-signed CA in `directory` (created 0700 if missing)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = _new_key()
    subject = _name(name)
    now = _now()
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return _write_pair(d, "ca", cert, key, force)


def load_ca(directory: str | Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    d = Path(directory)
    try:
        cert = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc.filename}: no CA here (run `sia certs init` first)"
                                ) from None
    return cert, key  # type: ignore[return-value]


def issue(directory: str | Path, kind: str, name: str, *, hosts: Sequence[str] = (),
          days: int = 365, force: bool = False, stem: str | None = None) -> Issued:
    """Issue one certificate signed by `directory`'s CA and write it there.

    kind "controller": a server certificate for `hosts` plus localhost/127.0.0.1/::1
    (file stem `controller`); "agent": a client certificate for node `name`
    (stem `agent-<name>`); "admin": a client certificate that may act as any node
    (stem `name`, "admin" by default).
    """
    if kind not in ("controller", "agent", "admin"):
        raise ValueError(f"kind: one of controller, agent, admin; got {kind!r}")
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"name: not usable as a certificate name: {name!r}")
    if days < 1:
        raise ValueError(f"days: must be >= 1, got {days}")
    d = Path(directory)
    ca_cert, ca_key = load_ca(d)
    key = _new_key()
    now = _now()
    builder = (x509.CertificateBuilder()
               .issuer_name(ca_cert.subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(min(now + datetime.timedelta(days=days),
                                    ca_cert.not_valid_after_utc))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(
                   digital_signature=True, content_commitment=False, key_encipherment=False,
                   data_encipherment=False, key_agreement=False, key_cert_sign=False,
                   crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                              critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca_key.public_key()), critical=False))
    if kind == "controller":
        builder = (builder.subject_name(_name(name))
                   .add_extension(_san([*hosts, *LOCAL_HOSTS]), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                                  critical=False))
        default_stem = "controller"
    elif kind == "agent":
        builder = (builder.subject_name(_name(name, AGENT_OU))
                   .add_extension(_san([name]), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                                  critical=False))
        default_stem = f"agent-{name}"
    else:
        builder = (builder.subject_name(_name(name, ADMIN_OU))
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                                  critical=False))
        default_stem = name
    cert = builder.sign(ca_key, hashes.SHA256())
    return _write_pair(d, stem or default_stem, cert, key, force)


def init_dev_pki(directory: str | Path, *, hosts: Sequence[str] = (),
                 agents: Sequence[str] = (), days: int = 365,
                 force: bool = False) -> dict[str, Issued]:
    """`sia certs init`: a CA, a controller certificate, one per agent, and admin."""
    out = {"ca": init_ca(directory, force=force)}
    out["controller"] = issue(directory, "controller", "sia-controller", hosts=hosts,
                              days=days, force=force)
    for node in dict.fromkeys(agents):
        out[f"agent-{node}"] = issue(directory, "agent", node, days=days, force=force)
    out["admin"] = issue(directory, "admin", "admin", days=days, force=force)
    return out
