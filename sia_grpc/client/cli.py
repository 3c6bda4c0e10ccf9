"""The user-facing `sia` commands that talk to a controller: submit, ls, get, cancel,
delete, watch, cluster, and (admin) drain and undrain.

`add_commands` registers them on the main parser's subparsers; each sets
`func(args) -> exit code`. Failures print one `error: ...` line to stderr and
return 1 (2 for a spec file that cannot be used), never a traceback. The
formatting lives in small pure functions so that it can be tested without a
controller.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import yaml

from sia_grpc.api import node_state_name, pb, state_name
from sia_grpc.client.sdk import DEFAULT_TARGET, SiaClient
from sia_grpc.client.spec import SpecError, load_spec, spec_to_mapping
from sia_grpc.errors import ApiError
from sia_grpc.security.tls import probe_tls

CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase screen: a redraw in place

# -- formatting (pure) ---------------------------------------------------------------


def parse_state(text: str) -> int:
    """pb.JOB_STATE_RUNNING for "running", "RUNNING" or "JOB_STATE_RUNNING"."""
    name = text.strip().upper().removeprefix("JOB_STATE_")
    try:
        return pb.JobState.Value(f"JOB_STATE_{name}")
    except ValueError:
        names = ", ".join(n.removeprefix("JOB_STATE_").lower()
                          for n in pb.JobState.keys()[1:])
        raise argparse.ArgumentTypeError(
            f"unknown state {text!r} (one of {names})") from None


def format_gpus(job: pb.Job) -> str:
    """"4×rtx" for a job holding four rtx GPUs, "-" for one holding none."""
    alloc = job.status.allocation
    return f"{alloc.num_gpus}×{alloc.gpu_type}" if alloc.num_gpus else "-"


def format_nodes(job: pb.Job) -> str:
    """The nodes the job's GPUs are on, in allocation order: "n0,n1"."""
    nodes = dict.fromkeys(g.node for g in job.status.allocation.gpus)
    return ",".join(nodes) or "-"


def table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """Left-aligned columns two spaces apart."""
    cells = [list(map(str, header)), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def jobs_table(jobs: Iterable[pb.Job], *, nodes: bool = False) -> str:
    """The `sia ls` table (with `nodes`, also where each job runs, for `sia watch`)."""
    header = ["ID", "NAME", "STATE", "GPUS", "BATCH", "PROGRESS", "RESTARTS"]
    header += ["NODES", "REASON"] if nodes else ["REASON"]
    rows = []
    for job in jobs:
        st = job.status
        row = [job.job_id, job.spec.name or "-", state_name(st.state), format_gpus(job),
               st.allocation.batch_size or "-", f"{st.progress * 100:.0f}%", st.restarts]
        row += [format_nodes(job)] if nodes else []
        rows.append([*row, st.message or st.reason])
    return table(header, rows)


def event_line(ev: pb.JobEvent) -> str:
    """One `sia watch` line when stdout is not a terminal."""
    job, st = ev.job, ev.job.status
    kind = pb.JobEvent.Kind.Name(ev.kind).removeprefix("KIND_")
    parts = [f"rev={ev.revision}", kind, job.job_id, state_name(st.state),
             f"gpus={format_gpus(job)}", f"nodes={format_nodes(job)}",
             f"batch={st.allocation.batch_size or '-'}", f"progress={st.progress * 100:.0f}%",
             f"restarts={st.restarts}"]
    reason = st.message or st.reason
    return " ".join(parts) + (f" reason={reason!r}" if reason else "")


def cluster_report(cluster: pb.Cluster, rounds: Iterable[pb.Round]) -> str:
    """`sia cluster`: GPUs by type, nodes with their allocation, and recent rounds."""
    out = [f"policy: {cluster.policy or '-'}  round: {cluster.round_duration_s:g}s", ""]
    out.append(table(["GPU TYPE", "NODES", "GPUS", "ALLOCATED", "FREE"],
                     [[t.gpu_type, t.nodes, t.gpus, t.allocated, t.gpus - t.allocated]
                      for t in cluster.types]))
    node_rows = []
    for n in cluster.nodes:
        jobs = dict.fromkeys(s.job_id for s in n.gpus if s.job_id)
        used = sum(1 for s in n.gpus if s.job_id)
        state = node_state_name(n.state)
        if n.drain_reason:
            state += f" ({n.drain_reason})"
        node_rows.append([n.name, n.gpu_type, state, f"{used}/{n.num_gpus}",
                          ",".join(jobs) or "-"])
    out += ["", table(["NODE", "TYPE", "STATE", "GPUS USED", "JOBS"], node_rows), ""]
    rounds = list(rounds)
    if not rounds:
        out.append("no scheduling rounds yet")
    else:
        out.append(table(
            ["ROUND", "TRIGGER", "JOBS", "GPUS", "MOVED", "SOLVE MS", "TOTAL MS", "NOTE"],
            [[r.round, r.trigger or "-", r.jobs, r.gpus_allocated, r.jobs_moved,
              f"{r.solve_ms:.1f}", f"{r.total_ms:.1f}", r.note] for r in rounds]))
    return "\n".join(out)


def _timestamp(ts: Any) -> str:
    return ts.ToDatetime(tzinfo=datetime.UTC).isoformat()


def job_to_mapping(job: pb.Job) -> dict[str, Any]:
    """`sia get` output; its `spec` is a valid spec file for `sia submit`."""
    st = job.status
    status: dict[str, Any] = {"state": state_name(st.state)}
    if st.HasField("allocation"):
        a = st.allocation
        status["allocation"] = {
            "gpu_type": a.gpu_type, "num_gpus": a.num_gpus, "num_nodes": a.num_nodes,
            "gpus": [f"{g.node}:{g.index}" for g in a.gpus], "batch_size": a.batch_size,
            "num_replicas": a.num_replicas, "atomic_batch_size": a.atomic_batch_size,
            "accum_steps": a.accum_steps}
    for name in ("restarts", "progress", "goodput", "reason", "message", "generation"):
        if getattr(st, name):
            status[name] = getattr(st, name)
    for name in ("create_time", "start_time", "finish_time", "update_time"):
        if st.HasField(name):
            status[name] = _timestamp(getattr(st, name))
    return {"job_id": job.job_id, "revision": job.revision,
            "spec": spec_to_mapping(job.spec), "status": status}


def error_line(err: ApiError, target: str, hint: str | None = None) -> str:
    """`hint`: what a failed connection's cause is, when known (`_transport_hint`)."""
    if hint:
        return f"error: {hint}"
    # Connection failures come from the client library with no ErrorInfo reason;
    # an UNAVAILABLE the controller chose to send has one and is shown as sent.
    if not err.reason and err.code == grpc.StatusCode.UNAVAILABLE:
        return f"error: cannot reach the controller at {target} (UNAVAILABLE)"
    if not err.reason and err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"error: the controller at {target} did not answer in time (DEADLINE_EXCEEDED)"
    return f"error: {err}"


# -- commands ------------------------------------------------------------------------


class _UsageError(Exception):
    """A credentials flag that cannot be used (exit 2)."""


def _token(args: argparse.Namespace) -> str | None:
    """--token-file's contents, else $SIA_TOKEN (the token itself)."""
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip()
        except OSError as err:
            raise _UsageError(f"--token-file: cannot read {args.token_file}: "
                              f"{err.strerror or err}") from None
        if not token:
            raise _UsageError(f"--token-file: {args.token_file} is empty")
        return token
    return os.environ.get("SIA_TOKEN", "").strip() or None


def _files(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """The TLS files (CA, client certificate, key): flags, else environment."""
    return (args.ca or os.environ.get("SIA_CA") or None,
            args.cert or os.environ.get("SIA_CERT") or None,
            args.key or os.environ.get("SIA_KEY") or None)


def _client(args: argparse.Namespace) -> SiaClient:
    ca, cert, key = _files(args)
    try:
        return SiaClient(args.controller, token=_token(args), ca=ca, cert=cert, key=key)
    except ValueError as err:  # an unreadable PEM file, a cert without its key
        raise _UsageError(str(err)) from None


def _submit(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.file)
    except OSError as err:
        raise SpecError("", f"cannot read: {err.strerror or err}", path=args.file) from None
    with _client(args) as sia:
        handle = sia.submit(spec, job_id=args.id or "")
        print(handle.job_id, flush=True)
        if not args.wait:
            return 0
        shown = None
        for job in handle.watch():
            line = f"{job.job_id} {state_name(job.status.state)} {format_gpus(job)}"
            if line != shown:
                print(line, flush=True)
                shown = line
        if job.status.message:
            print(f"{job.job_id}: {job.status.message}", flush=True)
        return 0 if job.status.state == pb.JOB_STATE_SUCCEEDED else 1


def _ls(args: argparse.Namespace) -> int:
    with _client(args) as sia:
        jobs = list(sia.list(states=args.state or (), tenant=args.tenant))
    print(jobs_table(jobs) if jobs else "no jobs")
    return 0


def _get(args: argparse.Namespace) -> int:
    with _client(args) as sia:
        data = job_to_mapping(sia.get(args.job))
    if args.output == "json":
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with _client(args) as sia:
        job = sia.cancel(args.job)
    print(f"{job.job_id} {state_name(job.status.state)}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with _client(args) as sia:
        sia.delete(args.job)
    print(f"{args.job} deleted")
    return 0


def _watch(args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty()
    jobs: dict[str, pb.Job] = {}
    with _client(args) as sia:
        try:
            for ev in sia.watch(job_id=args.job or ""):
                if ev.kind == pb.JobEvent.KIND_DELETED:
                    jobs.pop(ev.job.job_id, None)
                else:
                    jobs[ev.job.job_id] = ev.job
                if tty:
                    sys.stdout.write(f"{CLEAR}sia watch  {args.controller}  revision "
                                     f"{ev.revision}\n\n{jobs_table(jobs.values(), nodes=True)}\n")
                    sys.stdout.flush()
                else:
                    print(event_line(ev), flush=True)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a watch ends
    return 0


def _cluster(args: argparse.Namespace) -> int:
    with _client(args) as sia:
        report = cluster_report(sia.cluster(), sia.rounds())
    print(report)
    return 0


def _drain(args: argparse.Namespace) -> int:
    with _client(args) as sia:
        node = sia.drain(args.node, args.reason or "")
        print(f"{node.name} draining: {node.drain_reason}")
        if not args.wait:
            return 0
        deadline = time.monotonic() + args.timeout
        while True:
            (node,) = [n for n in sia.cluster().nodes if n.name == args.node] or [node]
            jobs = sorted({g.job_id for g in node.gpus if g.job_id})
            if not jobs:
                print(f"{node.name} drained: no job holds its GPUs")
                return 0
            if time.monotonic() > deadline:
                raise TimeoutError(f"{node.name} still holds {', '.join(jobs)} after "
                                   f"{args.timeout:g} s")
            print(f"  waiting for {len(jobs)} job(s) to move: {', '.join(jobs)}", flush=True)
            time.sleep(2.0)


def _undrain(args: argparse.Namespace) -> int:
    with _client(args) as sia:
        node = sia.undrain(args.node)
    print(f"{node.name} {node_state_name(node.state).lower()}")
    return 0


def _transport_hint(err: ApiError, args: argparse.Namespace) -> str | None:
    """For a connection that failed below gRPC (UNAVAILABLE, no reason): a TLS
    mismatch found by a handshake of our own, said with the flags that fix it."""
    if err.reason or err.code != grpc.StatusCode.UNAVAILABLE:
        return None
    ca, cert, key = _files(args)
    problem = probe_tls(args.controller, ca, cert, key)
    if problem is None:
        return None
    return problem.hint(ca=ca, cert=cert, ca_flag="--ca FILE (or SIA_CA)",
                        cert_flags="--cert FILE --key FILE (or SIA_CERT, SIA_KEY)",
                        issue="sia certs issue DIR --admin NAME")


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`func` with failures turned into one stderr line and an exit code."""
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (SpecError, _UsageError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except ApiError as err:
            print(error_line(err, args.controller, _transport_hint(err, args)),
                  file=sys.stderr)
            return 1
        except TimeoutError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    run.__doc__ = func.__doc__
    return run


def add_commands(subparsers: Any) -> None:
    """Register the controller commands on `parser.add_subparsers()`."""
    def command(name: str, help: str, func: Callable[[argparse.Namespace], int]) -> Any:
        p = subparsers.add_parser(name, help=help)
        p.add_argument("--controller", metavar="HOST:PORT", default=DEFAULT_TARGET,
                       help=f"the controller's address (default {DEFAULT_TARGET}; "
                            "env SIA_CONTROLLER)")
        p.add_argument("--token-file", metavar="FILE",
                       help="file holding the bearer token (default: env SIA_TOKEN, the "
                            "token itself)")
        p.add_argument("--ca", metavar="FILE",
                       help="CA certificate (PEM) of the controller's TLS certificate: "
                            "connect with TLS (env SIA_CA; default plaintext)")
        p.add_argument("--cert", metavar="FILE", help="client certificate (PEM; env SIA_CERT)")
        p.add_argument("--key", metavar="FILE", help="its private key (PEM; env SIA_KEY)")
        p.set_defaults(func=_guarded(func))
        return p

    p = command("submit", "submit a job from a YAML, TOML or JSON spec file", _submit)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--id", metavar="JOB_ID", help="the job's id (default: generated)")
    p.add_argument("--wait", action="store_true",
                   help="follow the job; exit 0 only if it succeeds")

    p = command("ls", "list jobs", _ls)
    p.add_argument("--state", type=parse_state, nargs="+", action="extend", metavar="STATE",
                   help="only jobs in these states (queued, running, ...)")
    p.add_argument("--tenant", default="", metavar="T", help="only this tenant's jobs")

    p = command("get", "show one job", _get)
    p.add_argument("job", metavar="JOB")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")

    p = command("cancel", "cancel a job (it stays listed as CANCELLED)", _cancel)
    p.add_argument("job", metavar="JOB")

    p = command("delete", "remove a finished job's record", _delete)
    p.add_argument("job", metavar="JOB")

    p = command("watch", "follow jobs and their allocations live (Ctrl-C to stop)", _watch)
    p.add_argument("job", metavar="JOB", nargs="?", help="only this job")

    command("cluster", "nodes, GPUs by type, and the last scheduling rounds", _cluster)

    p = command("drain", "admin: take a node out of scheduling; its jobs move elsewhere", _drain)
    p.add_argument("node", metavar="NODE")
    p.add_argument("--reason", metavar="TEXT", help="shown in 'sia cluster' and the agent's log")
    p.add_argument("--wait", action="store_true", help="return once no job holds its GPUs")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="with --wait: give up after S seconds (default 600)")

    p = command("undrain", "admin: let a drained node take work again", _undrain)
    p.add_argument("node", metavar="NODE")
