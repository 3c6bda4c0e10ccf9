"""The user-facing `sia` commands that talk to a controller: submit, ls, get, cancel,
delete, watch, cluster, queues, and (admin) drain, undrain and forget.

`add_commands` registers them on the main parser's subparsers; each sets
`func(args) -> exit code`. Failures print one `error: ...` line to stderr and
return 1 (2 for a spec file that cannot be used), never a traceback. The
formatting lives in small pure functions so that it can be tested without a
controller; what the dashboard and the demos show too (GPUs, nodes, ages, reasons,
the `ls` and `cluster` tables) is `api/present.py`'s.

`-o json` (and `-o yaml`, the same document) is the proto3 JSON mapping of the
messages (`google.protobuf.json_format`, field names as in the .proto files, every
field present), so scripts read exactly what `grpcurl` would show:
`ls` -> {"jobs": [Job, ...]}, `get` -> Job, `cluster` -> {"cluster": Cluster,
"rounds": [Round, ...]}, `queues` -> ListQueuesResponse (docs/operations.md,
"Scripting with -o json").
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import grpc
import yaml
from google.protobuf import json_format

from sia_grpc.api import node_state_name, pb, state_name
from sia_grpc.api.errors import ApiError
from sia_grpc.api.present import (
    cluster_report,
    format_counts,
    format_gpus,
    format_nodes,
    format_time,
    job_reason,
    jobs_table,
    sorted_jobs,
    table,
)
from sia_grpc.cli import argparsing
from sia_grpc.cli.argparsing import UsageError
from sia_grpc.client.sdk import DEFAULT_TARGET, JobHandle, JobView, SiaClient, is_terminal
from sia_grpc.client.spec import SpecError, load_spec, parse_spec, spec_to_mapping
from sia_grpc.security.tls import probe_tls

CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase screen: a redraw in place
STDIN = "-"  # `sia submit -`: the spec comes on standard input
_now = time.time  # the clock AGE is measured with (tests set another)

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


def event_line(ev: pb.JobEvent) -> str:
    """One `sia watch` line (off a terminal, or with --events)."""
    job, st = ev.job, ev.job.status
    kind = pb.JobEvent.Kind.Name(ev.kind).removeprefix("KIND_")
    parts = [f"rev={ev.revision}", kind, job.job_id, state_name(st.state),
             f"gpus={format_gpus(job)}", f"nodes={format_nodes(job)}",
             f"batch={st.allocation.batch_size or '-'}", f"progress={st.progress * 100:.0f}%",
             f"restarts={st.restarts}"]
    reason = job_reason(job)
    return " ".join(parts) + (f" reason={reason!r}" if reason else "")


def queues_report(resp: pb.ListQueuesResponse) -> str:
    """`sia queues`: each queue's guarantee, what it holds, borrows and may borrow, its
    jobs; then the priority classes and the preemption bounds."""
    rows = []
    for q in resp.queues:
        s = q.spec
        units = f"{s.guarantee_units:g} units" if s.guarantee_units else ""
        held = format_counts(q.held)
        if s.guarantee_units and q.held_units:
            held += f" ({q.held_units:g} units)"
        rows.append([s.name, ",".join(s.tenants) or "*", format_counts(s.guarantee, units),
                     held, format_counts(q.borrowed), format_counts(s.borrow_limit, zeros=True),
                     q.pending_jobs, q.running_jobs])
    out = [table(["QUEUE", "TENANTS", "GUARANTEE", "HELD", "BORROWED", "BORROW LIMIT",
                  "PENDING", "RUNNING"], rows)]
    cfg = resp.config
    classes = ", ".join(f"{c.name} ({c.weight:g})" for c in cfg.priority_class)
    out += ["", f"priority classes (weight): {classes or '-'}; default {cfg.default_priority}"]
    restarts = (cfg.max_restarts_per_round if cfg.HasField("max_restarts_per_round")
                else "no limit")
    out.append(f"preemption: minimum runtime {cfg.min_runtime_s:g}s; restarts per round: "
               f"{restarts}")
    return "\n".join(out)


def _timestamp(ts: Any) -> str:
    return ts.ToDatetime(tzinfo=datetime.UTC).isoformat()


def job_to_mapping(job: pb.Job) -> dict[str, Any]:
    """`sia get`'s readable view; its `spec` is a valid spec file for `sia submit`."""
    st = job.status
    status: dict[str, Any] = {"state": state_name(st.state)}
    if st.HasField("allocation"):
        a = st.allocation
        status["allocation"] = {
            "gpu_type": a.gpu_type, "num_gpus": a.num_gpus, "num_nodes": a.num_nodes,
            "gpus": [f"{g.node}:{g.index}" for g in a.gpus], "batch_size": a.batch_size,
            "num_replicas": a.num_replicas, "atomic_batch_size": a.atomic_batch_size,
            "accum_steps": a.accum_steps}
    for name in ("restarts", "restart_seconds", "progress", "goodput", "throughput",
                 "reason", "message", "generation"):
        if getattr(st, name):
            status[name] = getattr(st, name)
    for name in ("create_time", "start_time", "finish_time", "update_time"):
        if st.HasField(name):
            status[name] = _timestamp(getattr(st, name))
    return {"job_id": job.job_id, "revision": job.revision,
            "spec": spec_to_mapping(job.spec), "status": status}


def message_to_data(msg: Any) -> dict[str, Any]:
    """The proto3 JSON mapping of a message (an SDK view: of its message), with the
    .proto's field names and every field present: what `-o json` prints."""
    return json_format.MessageToDict(msg.proto if isinstance(msg, JobView) else msg,
                                     preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def dump(data: Any, output: str) -> str:
    """`data` as `-o json` or `-o yaml` prints it."""
    if output == "json":
        return json.dumps(data, indent=2, ensure_ascii=False)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n")


def describe_error(err: ApiError, target: str, hint: str | None = None) -> str:
    """`hint`: what a failed connection's cause is, when known (`_transport_hint`)."""
    if hint:
        return hint
    # Connection failures come from the client library with no ErrorInfo reason;
    # an UNAVAILABLE the controller chose to send has one and is shown as sent.
    if not err.reason and err.code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the controller at {target} (UNAVAILABLE)"
    if not err.reason and err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the controller at {target} did not answer in time (DEADLINE_EXCEEDED)"
    return str(err)


def error_line(err: ApiError, target: str, hint: str | None = None) -> str:
    return f"error: {describe_error(err, target, hint)}"


def _unreachable(err: ApiError) -> bool:
    """A failure of the connection, not the controller's answer about one request."""
    return not err.reason and err.code in (grpc.StatusCode.UNAVAILABLE,
                                           grpc.StatusCode.DEADLINE_EXCEEDED)


# -- commands ------------------------------------------------------------------------


def _token(args: argparse.Namespace) -> str | None:
    """--token-file's contents, else $SIA_TOKEN (the token itself)."""
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip()
        except OSError as err:
            raise UsageError(f"--token-file: cannot read {args.token_file}: "
                              f"{err.strerror or err}") from None
        if not token:
            raise UsageError(f"--token-file: {args.token_file} is empty")
        return token
    return os.environ.get("SIA_TOKEN", "").strip() or None


def _files(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """The TLS files (CA, client certificate, key): flags, else environment."""
    return (args.ca or os.environ.get("SIA_CA") or None,
            args.cert or os.environ.get("SIA_CERT") or None,
            args.key or os.environ.get("SIA_KEY") or None)


def connect(args: argparse.Namespace, make: Callable[..., Any] = SiaClient) -> Any:
    """A client (`make`: SiaClient, or AsyncSiaClient) for the connection flags
    (`connection_flags`): the controller's address, its token and TLS files."""
    ca, cert, key = _files(args)
    try:
        return make(args.controller, token=_token(args), ca=ca, cert=cert, key=key)
    except ValueError as err:  # an unreadable PEM file, a cert without its key
        raise UsageError(str(err)) from None


def _read_spec(name: str) -> pb.JobSpec:
    if name == STDIN:
        return parse_spec(sys.stdin.read(), name="<stdin>")  # YAML or JSON
    try:
        return load_spec(name)
    except OSError as err:
        raise SpecError("", f"cannot read: {err.strerror or err}", path=name) from None


def _read_specs(names: list[str]) -> list[tuple[str, pb.JobSpec]] | None:
    """Every spec, read and checked before any is submitted; None (each bad file
    reported on stderr) if one cannot be used."""
    specs, bad = [], 0
    for name in names:
        try:
            specs.append((name, _read_spec(name)))
        except SpecError as err:
            print(f"error: {err}", file=sys.stderr)
            bad += 1
    return None if bad else specs


def _follow(handle: JobHandle) -> bool:
    """Print the job's state as it changes until it ends; whether it succeeded."""
    shown = None
    for job in handle.watch():
        line = f"{job.job_id} {job.state} {format_gpus(cast(pb.Job, job))}"  # (a JobView)
        if line != shown:
            print(line, flush=True)
            shown = line
    if job.status.message:
        print(f"{job.job_id}: {job.status.message}", flush=True)
    return job.state == pb.JOB_STATE_SUCCEEDED


def _submit(args: argparse.Namespace) -> int:
    if args.files.count(STDIN) > 1:
        raise UsageError("'-' (standard input) can be given once")
    if args.id and len(args.files) > 1:
        raise UsageError("--id: names one job; give one spec file with it")
    specs = _read_specs(args.files)
    if specs is None:
        return 2  # nothing was submitted
    several = len(specs) > 1
    handles, rejected = [], 0
    with connect(args) as sia:
        for name, spec in specs:
            try:
                handles.append(sia.submit(spec, job_id=args.id or ""))
            except ApiError as err:
                if not several or _unreachable(err):
                    raise
                print(f"error: {name}: {describe_error(err, args.controller)}", file=sys.stderr)
                rejected += 1
                continue
            print(handles[-1].job_id, flush=True)
        succeeded = [_follow(h) for h in handles] if args.wait else []
    return 1 if rejected or not all(succeeded) else 0


def _jobs(args: argparse.Namespace, sia: SiaClient) -> list[pb.Job]:
    # (JobViews: each reads as the pb.Job it wraps)
    return sorted_jobs(cast(Iterable[pb.Job], sia.list(states=args.state or (),
                                                       tenant=args.tenant)))


def _ls(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        jobs = _jobs(args, sia)
    if args.output in ("json", "yaml"):
        print(dump({"jobs": [message_to_data(j) for j in jobs]}, args.output))
    else:
        print(jobs_table(jobs, now=_now(), wide=args.output == "wide") if jobs
              else "no jobs")
    return 0


def _get(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        job = sia.get(args.job)
    if args.output in ("json", "yaml"):
        print(dump(message_to_data(job), args.output))
    elif args.output == "wide":
        print(jobs_table([job], now=_now(), wide=True))
    else:
        print(dump(job_to_mapping(job), "yaml"))
    return 0


def parse_selector(text: str) -> dict[str, str]:
    """`--selector key=value[,key=value]`: the labels a job must all have."""
    labels: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise argparse.ArgumentTypeError(
                f"expected key=value[,key=value], got {text!r}")
        labels[key.strip()] = value.strip()
    return labels


def matches(job: pb.Job, selector: dict[str, str]) -> bool:
    """Whether the job's labels (JobSpec.labels) hold every key=value of `selector`."""
    return all(job.spec.labels.get(key) == value for key, value in selector.items())


CONFIRM_SHOWN = 10  # the jobs a confirmation names; the rest are counted


def confirm(verb: str, ids: list[str], assume_yes: bool) -> bool:
    """Ask on the terminal before acting on jobs picked by --selector or --all (as
    `kubectl delete` and `scancel` ask); -y/--yes skips it. With no terminal to ask
    on, refuse (a UsageError) rather than wait for an answer that never comes."""
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"{verb} {len(ids)} job(s): confirm with -y/--yes (no terminal "
                         f"to ask on)")
    shown = ", ".join(ids[:CONFIRM_SHOWN])
    if len(ids) > CONFIRM_SHOWN:
        shown += f", and {len(ids) - CONFIRM_SHOWN} more"
    print(f"{verb} {len(ids)} job(s): {shown}", file=sys.stderr)
    sys.stderr.write("continue? [y/N] ")
    sys.stderr.flush()
    try:
        answer = input()
    except EOFError:
        answer = ""
    return answer.strip().lower() in ("y", "yes")


def _targets(args: argparse.Namespace, sia: SiaClient, finished: bool) -> list[str] | None:
    """The job ids a cancel or delete acts on: those named, else those --selector or
    --all picks among the jobs that can take it (active ones for cancel, `finished`
    ones for delete), confirmed (`confirm`; None: the user said no)."""
    picked = sum((bool(args.jobs), args.selector is not None, args.all))
    if picked != 1:
        raise UsageError("give job ids, or --selector key=value, or --all (one of them)")
    if args.jobs:
        return list(dict.fromkeys(args.jobs))  # (each once, in the order given)
    selector = args.selector or {}
    ids = [j.job_id for j in _jobs_for(sia) if is_terminal(j) == finished
           and matches(j, selector)]
    if not ids:
        return ids
    verb = "delete" if finished else "cancel"
    return ids if confirm(verb, ids, args.yes) else None


def _jobs_for(sia: SiaClient) -> list[pb.Job]:
    return sorted_jobs(cast(Iterable[pb.Job], sia.list()))


def _each(args: argparse.Namespace, finished: bool,
          act: Callable[[SiaClient, str], str]) -> int:
    """Act on each target job (`_targets`), one line each: its result on stdout, or
    its error on stderr and on to the next. Exit 1 if any failed; a lost connection
    stops at once (as one error)."""
    failed = 0
    with connect(args) as sia:
        ids = _targets(args, sia, finished)
        if ids is None:
            print("nothing done", file=sys.stderr)
            return 1
        if not ids:
            print("no jobs match", file=sys.stderr)
            return 0
        for job_id in ids:
            try:
                line = act(sia, job_id)
            except ApiError as err:
                if _unreachable(err):
                    raise
                print(f"error: {job_id}: {describe_error(err, args.controller)}",
                      file=sys.stderr, flush=True)
                failed += 1
                continue
            print(line, flush=True)
    return 1 if failed else 0


def _cancel(args: argparse.Namespace) -> int:
    def cancel(sia: SiaClient, job_id: str) -> str:
        job = sia.cancel(job_id)
        return f"{job.job_id} {job.state}"
    return _each(args, False, cancel)


def _delete(args: argparse.Namespace) -> int:
    def delete(sia: SiaClient, job_id: str) -> str:
        sia.delete(job_id)
        return f"{job_id} deleted"
    return _each(args, True, delete)


def _watch(args: argparse.Namespace) -> int:
    table_view = sys.stdout.isatty() and not args.events
    jobs: dict[str, pb.Job] = {}
    with connect(args) as sia:
        try:
            for ev in sia.watch(job_id=args.job or ""):
                if ev.kind == pb.JobEvent.KIND_DELETED:
                    jobs.pop(ev.job.job_id, None)
                else:
                    jobs[ev.job.job_id] = ev.job
                if table_view:
                    shown = jobs_table(jobs.values(), now=_now()) if jobs else "no jobs"
                    sys.stdout.write(f"{CLEAR}sia watch  {args.controller}  revision "
                                     f"{ev.revision}\n\n{shown}\n")
                    sys.stdout.flush()
                else:
                    print(event_line(ev), flush=True)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a watch ends
    return 0


def _cluster(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        cluster, rounds = sia.cluster(), sia.rounds(limit=args.rounds)
    if args.output in ("json", "yaml"):
        print(dump({"cluster": message_to_data(cluster),
                    "rounds": [message_to_data(r) for r in rounds]}, args.output))
    else:
        print(cluster_report(cluster, rounds, wide=args.output == "wide"))
    return 0


def _queues(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        resp = sia.queues()
    if args.output in ("json", "yaml"):
        print(dump(message_to_data(resp), args.output))
    else:
        print(queues_report(resp))
    return 0


def _drain(args: argparse.Namespace) -> int:
    with connect(args) as sia:
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
    with connect(args) as sia:
        node = sia.undrain(args.node)
    print(f"{node.name} {node_state_name(node.state).lower()}")
    return 0


def _transport_hint(err: ApiError, args: argparse.Namespace) -> str | None:
    """For a connection that failed below gRPC (UNAVAILABLE, no reason): a TLS
    mismatch found by a handshake of our own, said with the flags that fix it."""
    if err.reason or err.code != grpc.StatusCode.UNAVAILABLE:
        return None
    ca, cert, key = _files(args)
    problem = probe_tls(args.controller.split(",")[0].strip(), ca, cert, key)  # (of a pair: one)
    if problem is None:
        return None
    return problem.hint(ca=ca, cert=cert, ca_flag="--ca FILE (or SIA_CA)",
                        cert_flags="--cert FILE --key FILE (or SIA_CERT, SIA_KEY)",
                        issue="sia certs issue DIR --admin NAME")


def _forget(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        node = sia.forget_node(args.node)
    print(f"{node.name} forgotten ({node.gpu_type or 'unknown type'}, {node.num_gpus} GPUs, "
          f"last heartbeat {format_time(node.last_heartbeat)})")
    return 0


def api_error_line(err: ApiError, args: argparse.Namespace) -> str:
    """How a command that talks to a controller reports its error (exit 1)."""
    return error_line(err, args.controller, _transport_hint(err, args))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def connection_flags(p: Any, *, defaults: bool = True) -> Any:
    """--controller, --token-file, --ca, --cert, --key: how a command reaches the
    controller (`connect`), on parser or argument group `p`. `defaults=False`: none
    (argparse.SUPPRESS), for the same flags before the subcommand
    (`argparsing.GlobalFlagsFirst`)."""
    def default(value: str | None) -> str | None:
        return value if defaults else argparse.SUPPRESS

    p.add_argument("--controller", metavar="HOST:PORT[,HOST:PORT]",
                   default=default(DEFAULT_TARGET),
                   help=f"the controller's address, or a pair's comma-separated, or one "
                        f"DNS name with several records (the leader is found; default "
                        f"{DEFAULT_TARGET}; env SIA_CONTROLLER)")
    p.add_argument("--token-file", metavar="FILE", default=default(None),
                   help="file holding the bearer token (default: env SIA_TOKEN, the "
                        "token itself)")
    p.add_argument("--ca", metavar="FILE", default=default(None),
                   help="CA certificate (PEM) of the controller's TLS certificate: "
                        "connect with TLS (env SIA_CA; default plaintext)")
    p.add_argument("--cert", metavar="FILE", default=default(None),
                   help="client certificate (PEM; env SIA_CERT)")
    p.add_argument("--key", metavar="FILE", default=default(None),
                   help="its private key (PEM; env SIA_KEY)")
    return p


def add_commands(subparsers: Any) -> None:
    """Register the controller commands on `parser.add_subparsers()`."""
    def command(name: str, summary: str, func: Callable[[argparse.Namespace], int]) -> Any:
        return connection_flags(
            argparsing.command(subparsers, name, summary, func, usage=(SpecError,)))

    def selection(p: Any, everything: str) -> None:
        p.add_argument("jobs", metavar="JOB", nargs="*",
                       help="the jobs' ids; each is reported on its own line, and the exit "
                            "status is 1 if any failed")
        p.add_argument("-l", "--selector", type=parse_selector, metavar="KEY=VALUE[,...]",
                       help=f"instead of ids: {everything} whose labels match all of these")
        p.add_argument("--all", action="store_true", help=f"instead of ids: {everything}")
        p.add_argument("-y", "--yes", action="store_true",
                       help="with --selector or --all: no confirmation (needed when there "
                            "is no terminal to ask on)")

    def output(p: Any, default: str) -> None:
        p.add_argument("-o", "--output", choices=("json", "yaml", "wide"), default=None,
                       help=f"json or yaml: the proto3 JSON mapping, for scripts "
                            f"(docs/operations.md); wide: more columns (default: {default})")

    p = command("submit", "submit jobs from YAML, TOML or JSON spec files ('-': from stdin)",
                _submit)
    p.add_argument("files", metavar="FILE", nargs="+",
                   help="a spec file, or '-' to read one (YAML or JSON) from standard input; "
                        "all are checked before any is submitted")
    p.add_argument("--id", metavar="JOB_ID", help="the job's id (default: generated)")
    p.add_argument("--wait", action="store_true",
                   help="follow the jobs; exit 0 only if they all succeed")

    p = command("ls", "list jobs, oldest first (by create time, then id)", _ls)
    p.add_argument("--state", type=parse_state, nargs="+", action="extend", metavar="STATE",
                   help="only jobs in these states (queued, running, ...)")
    p.add_argument("--tenant", default="", metavar="T", help="only this tenant's jobs")
    output(p, "a table")

    p = command("get", "show one job", _get)
    p.add_argument("job", metavar="JOB", help="the job's id")
    output(p, "a readable YAML view whose spec is a spec file")

    p = command("cancel", "cancel jobs (they stay listed as CANCELLED): by id, by label, "
                          "or all", _cancel)
    selection(p, "every active job")

    p = command("delete", "remove finished jobs' records: by id, by label, or all", _delete)
    selection(p, "every finished job")

    p = command("watch", "follow jobs live: a table redrawn in place on a terminal, else "
                         "one line per change (Ctrl-C to stop)", _watch)
    p.add_argument("job", metavar="JOB", nargs="?", help="only this job (default: all)")
    p.add_argument("--events", action="store_true",
                   help="one line per change even on a terminal")

    p = command("cluster", "nodes, GPUs by type, and the last scheduling rounds", _cluster)
    p.add_argument("--rounds", type=_positive, default=20, metavar="N",
                   help="how many recent rounds (default 20; the controller keeps 1000)")
    output(p, "tables")

    p = command("queues", "queues: guarantees, GPUs held and borrowed, waiting jobs", _queues)
    p.add_argument("-o", "--output", choices=("json", "yaml"), default=None,
                   help="json or yaml: the proto3 JSON mapping, for scripts (default: a table)")

    p = command("drain", "admin: take a node out of scheduling; its jobs move elsewhere", _drain)
    p.add_argument("node", metavar="NODE", help="the node's id (as 'sia cluster' lists it)")
    p.add_argument("--reason", metavar="TEXT", help="shown in 'sia cluster' and the agent's log")
    p.add_argument("--wait", action="store_true", help="return once no job holds its GPUs")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="with --wait: give up after S seconds (default 600)")

    p = command("undrain", "admin: let a drained node take work again", _undrain)
    p.add_argument("node", metavar="NODE", help="the node's id")

    p = command("forget", "admin: remove a LOST node (its agent gone for good) and its drain",
                _forget)
    p.add_argument("node", metavar="NODE", help="the node's id; it must be LOST")
