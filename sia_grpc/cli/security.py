"""`sia certs ...` and `sia tokens ...`: development PKI and bearer tokens.

    sia certs init DIR [--hosts controller.example,10.0.0.5] [--agents node-1 node-2]
    sia certs issue DIR --agent node-3 | --controller --hosts ... | --admin [NAME]
    sia tokens add --file tokens.toml --tenant team-a [--admin] [--name ci] [--queue Q]
    sia tokens list tokens.toml
    sia tokens revoke tokens.toml ci
"""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import Any

from sia_grpc.cli.argparsing import runs, subcommand


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


class _Names(argparse.Action):
    """`--agents n1,n2`, `--agents n1 n2` (what `$(kubectl get nodes ...)` gives) or
    both: one list of names."""

    def __call__(self, parser: Any, namespace: Any, values: Any, _option: Any = None) -> None:
        setattr(namespace, self.dest, [n for v in values for n in _names(v)])


def _certs_init(args: argparse.Namespace) -> int:
    from sia_grpc.security.certs import init_dev_pki

    issued = init_dev_pki(args.dir, hosts=args.hosts, agents=args.agents, days=args.days,
                          force=args.force)
    for name, files in issued.items():
        print(f"{name:<24} {files.cert}  {files.key}")
    print(f"\nkeys are mode 0600; keep {issued['ca'].key} off the cluster "
          "(it signs new certificates)")
    return 0


def _certs_issue(args: argparse.Namespace) -> int:
    from sia_grpc.security.certs import issue

    if args.agent:
        files = issue(args.dir, "agent", args.agent, days=args.days, force=args.force)
    elif args.controller:
        files = issue(args.dir, "controller", "sia-controller", hosts=args.hosts,
                      days=args.days, force=args.force)
    else:
        files = issue(args.dir, "admin", args.admin, days=args.days, force=args.force)
    print(f"{files.cert}  {files.key}")
    return 0


def _tokens_add(args: argparse.Namespace) -> int:
    from sia_grpc.security.tokens import add_token

    token = add_token(args.file, args.tenant, admin=args.admin, name=args.name or "",
                      queues=args.queue)
    role = "an admin" if args.admin else "a user"
    bound = f", bound to queues {', '.join(args.queue)}" if args.queue else ""
    print(f"added {role} token for tenant {args.tenant!r}{bound} to {args.file} (only its hash "
          "is stored); it is shown once:", file=sys.stderr)
    print(token)
    return 0


def _tokens_list(args: argparse.Namespace) -> int:
    from sia_grpc.api.present import table
    from sia_grpc.security.tokens import list_tokens

    tokens = list_tokens(args.file)
    if not tokens:
        print(f"no tokens in {args.file}")
        return 0
    print(table(["ID", "NAME", "TENANT", "ROLE", "QUEUES", "CREATED"],
                [[t.id, t.name or "-", t.tenant, t.role, ",".join(t.queues) or "-",
                  _utc(t.created)] for t in tokens]))
    return 0


def _utc(when: datetime.datetime | None) -> str:
    """2026-01-05T09:30:00Z (a date-time written without an offset: as written)."""
    if when is None:
        return "-"
    if when.tzinfo is None:
        return when.replace(microsecond=0).isoformat()
    return when.astimezone(datetime.UTC).replace(microsecond=0, tzinfo=None).isoformat() + "Z"


def _tokens_revoke(args: argparse.Namespace) -> int:
    from sia_grpc.security.tokens import revoke_token

    for t in revoke_token(args.file, args.token):
        print(f"revoked token {t.id} ({t.name or 'no name'}, {t.role} of tenant {t.tenant!r}) "
              f"from {args.file}")
    print("the controller refuses it once it sees the file change (within a second; "
          "SIGHUP: at once)", file=sys.stderr)
    return 0


# FileExistsError (no --force), an unreadable file, TokenError, a bad name: exit 2.
USAGE = (OSError, ValueError)


def add_commands(sub: Any) -> None:
    certs = subcommand(sub, "certs", "development CA and TLS certificates (docs/security.md)")
    csub = certs.add_subparsers(dest="certs", required=True, metavar="COMMAND")
    init = subcommand(csub, "init", "a CA, a controller certificate, one client "
                                    "certificate per agent, and an admin certificate")
    init.add_argument("dir", metavar="DIR", help="where to write them (created if missing)")
    init.add_argument("--hosts", nargs="+", action=_Names, default=[], metavar="HOST",
                      help="the controller's DNS names and IPs, separated by commas or spaces "
                           "(localhost, 127.0.0.1 and ::1 are always added)")
    init.add_argument("--agents", nargs="+", action=_Names, default=[], metavar="NODE",
                      help="node ids to issue agent certificates for (CN = node id), separated "
                           "by commas or spaces")
    init.add_argument("--days", type=int, default=365, help="leaf validity (default 365)")
    init.add_argument("--force", action="store_true", help="replace existing files")
    runs(init, _certs_init, usage=USAGE)

    iss = subcommand(csub, "issue", "one more certificate signed by DIR's CA")
    iss.add_argument("dir", metavar="DIR", help="the directory 'sia certs init' wrote")
    kind = iss.add_mutually_exclusive_group(required=True)
    kind.add_argument("--agent", metavar="NODE", help="a client certificate for node NODE")
    kind.add_argument("--controller", action="store_true",
                      help="a new controller server certificate (with --hosts)")
    kind.add_argument("--admin", nargs="?", const="admin", metavar="NAME",
                      help="an admin client certificate (may register any node id)")
    iss.add_argument("--hosts", nargs="+", action=_Names, default=[], metavar="HOST",
                     help="with --controller: its DNS names and IPs")
    iss.add_argument("--days", type=int, default=365, help="validity (default 365)")
    iss.add_argument("--force", action="store_true", help="replace existing files (renewal)")
    runs(iss, _certs_issue, usage=USAGE)

    tokens = subcommand(sub, "tokens", "bearer tokens for tenants (docs/security.md)")
    tsub = tokens.add_subparsers(dest="tokens", required=True, metavar="COMMAND")
    add = subcommand(tsub, "add", "make a token, append its SHA-256 to FILE, print it once")
    add.add_argument("--file", required=True, metavar="FILE", help="the tokens file (TOML)")
    add.add_argument("--tenant", required=True, help="the tenant whose jobs the token acts on")
    add.add_argument("--admin", action="store_true", help="sees and manages every tenant's jobs")
    add.add_argument("--name", help="a label kept beside the hash (who or what uses it)")
    add.add_argument("--queue", action="append", default=[], metavar="QUEUE",
                     help="bind the token to this queue (repeatable; the first is where a spec "
                          "naming none goes); default: any queue that admits the tenant")
    runs(add, _tokens_add, usage=USAGE)

    ls = subcommand(tsub, "list", "the tokens in FILE: id, name, tenant, role, created "
                                  "(never the token nor its hash)")
    ls.add_argument("file", metavar="FILE", help="the tokens file (TOML)")
    runs(ls, _tokens_list, usage=USAGE)

    rv = subcommand(tsub, "revoke", "remove a token from FILE; the controller refuses it "
                                    "as soon as it sees the change")
    rv.add_argument("file", metavar="FILE", help="the tokens file (TOML)")
    rv.add_argument("token", metavar="NAME_OR_ID",
                    help="the token's name, or its id from 'sia tokens list' (6+ hex digits)")
    runs(rv, _tokens_revoke, usage=USAGE)
