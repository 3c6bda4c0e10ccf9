#!/usr/bin/env python3
"""sia-healthcheck: ask a controller's grpc.health.v1 service whether it is SERVING.

Exit 0 when it is, 1 otherwise (the reason on stderr). Installed as
/usr/local/bin/sia-healthcheck in the controller image and used by its
Kubernetes exec probes and its Docker HEALTHCHECK.

Why not the kubelet's native gRPC probe (`grpc: {port: 50051}`): it speaks
plaintext only (up to Kubernetes 1.36; 1.37 adds `mode: TLS`), and the
controller serves TLS on every port off loopback. This runs inside the
container, so it reaches the controller on 127.0.0.1 and verifies its
certificate with `--ca` (the certificates `sia certs init` makes name
localhost and 127.0.0.1; for another PKI give `--server-name`, a name in the
certificate). Health checks need no token and no client certificate.

    sia-healthcheck [--addr 127.0.0.1:50051] [--ca FILE] [--server-name NAME]
                    [--service NAME] [--timeout SECONDS] [--any-status]

With `--any-status` it succeeds on any answer, NOT_SERVING included: the liveness
check of a controller pair. A standby answers NOT_SERVING (only the leader is
SERVING), and restarting it would not make it lead; what liveness must catch is a
process that no longer answers at all (hung, deadlocked).

Settings also come from the environment: SIA_HEALTH_ADDR, SIA_CA,
SIA_HEALTH_SERVER_NAME. Without a CA the check is plaintext (the loopback
development mode). Only grpcio and grpcio-health-checking are needed.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sia-healthcheck",
                                description="grpc.health.v1 check of a sia controller")
    p.add_argument("--addr", default=os.environ.get("SIA_HEALTH_ADDR", "127.0.0.1:50051"),
                   metavar="HOST:PORT", help="default 127.0.0.1:50051 (env SIA_HEALTH_ADDR)")
    p.add_argument("--ca", default=os.environ.get("SIA_CA") or None, metavar="FILE",
                   help="CA of the controller's certificate: check over TLS (env SIA_CA)")
    p.add_argument("--server-name", default=os.environ.get("SIA_HEALTH_SERVER_NAME") or None,
                   metavar="NAME", help="name to verify the certificate against "
                                        "(default: the host in --addr)")
    p.add_argument("--service", default="", metavar="NAME",
                   help="a service name, e.g. sia.v1.JobService (default: the server)")
    p.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS")
    p.add_argument("--any-status", action="store_true",
                   help="succeed on any answer, NOT_SERVING too (liveness: a standby is alive)")
    return p


def check(addr: str, *, ca: str | None = None, server_name: str | None = None,
          service: str = "", timeout: float = 3.0) -> str:
    """The serving status's name (e.g. "SERVING"); raises grpc.RpcError or OSError."""
    if ca:
        with open(ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        channel = grpc.secure_channel(addr, creds, options=options)
    else:
        channel = grpc.insecure_channel(addr)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        status = check(args.addr, ca=args.ca, server_name=args.server_name,
                       service=args.service, timeout=args.timeout)
    except grpc.RpcError as err:
        print(f"sia-healthcheck: {args.addr}: {err.code().name}: {err.details()}",
              file=sys.stderr)
        return 1
    except OSError as err:
        print(f"sia-healthcheck: {err}", file=sys.stderr)
        return 1
    if status != "SERVING" and not args.any_status:
        print(f"sia-healthcheck: {args.addr}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
