"""The `sia` commands about one's jobs: submit, ls, get, cancel, delete and watch.

`add_commands` registers them on the main parser's subparsers; each sets
`func(args) -> exit code`. Failures print one `error: ...` line to stderr and
return 1 (2 for a spec file that cannot be used), never a traceback
(`cli/connection.py`). The formatting lives in small pure functions so that it can
be tested without a controller; what the dashboard and the demos show too (GPUs,
nodes, ages, reasons, the `ls` table) is `api/present.py`'s, and `-o json` / `-o yaml`
is `cli/output.py`'s. The views of the cluster and the node admin commands are in
`cli/cluster.py`.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from sia_grpc.api import pb, state_name
from sia_grpc.api.errors import ApiError
from sia_grpc.api.present import format_gpus, format_nodes, job_reason, jobs_table, sorted_jobs
from sia_grpc.cli.argparsing import UsageError, examples
from sia_grpc.cli.connection import (
    connect,
    controller_command,
    describe_error,
    interruptible,
    unreachable,
)
from sia_grpc.cli.output import dump, message_to_data, output_flag
from sia_grpc.client.sdk import JobHandle, SiaClient, is_terminal
from sia_grpc.client.spec import SpecError, load_spec, parse_spec, spec_to_mapping

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


# -- commands ------------------------------------------------------------------------


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
    for job in interruptible(handle.watch()):
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
                if not several or unreachable(err):
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


def _default_priority(sia: SiaClient) -> str | None:
    """The configured default priority class, which `-o wide` names for a job that
    names none; None where the controller does not say (one without queues' API)."""
    try:
        return sia.queues().config.default_priority
    except ApiError as err:
        if unreachable(err):
            raise
        return None


def _ls(args: argparse.Namespace) -> int:
    wide = args.output == "wide"
    with connect(args) as sia:
        jobs = _jobs(args, sia)
        default = _default_priority(sia) if wide and jobs else None
    if args.output in ("json", "yaml"):
        print(dump({"jobs": [message_to_data(j) for j in jobs]}, args.output))
    else:
        print(jobs_table(jobs, now=_now(), wide=wide, default_priority=default) if jobs
              else "no jobs")
    return 0


def _get(args: argparse.Namespace) -> int:
    with connect(args) as sia:
        job = sia.get(args.job)
        default = _default_priority(sia) if args.output == "wide" else None
    if args.output in ("json", "yaml"):
        print(dump(message_to_data(job), args.output))
    elif args.output == "wide":
        print(jobs_table([job], now=_now(), wide=True, default_priority=default))
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
                if unreachable(err):
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
            for ev in interruptible(sia.watch(job_id=args.job or "")):
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


def _selection_flags(p: Any, everything: str) -> None:
    """How cancel and delete pick their jobs (`_targets`): ids, a label selector, or
    `everything` they can act on."""
    p.add_argument("jobs", metavar="JOB", nargs="*",
                   help="the jobs' ids; each is reported on its own line, and the exit "
                        "status is 1 if any failed")
    p.add_argument("-l", "--selector", type=parse_selector, metavar="KEY=VALUE[,...]",
                   help=f"instead of ids: {everything} whose labels match all of these")
    p.add_argument("--all", action="store_true", help=f"instead of ids: {everything}")
    p.add_argument("-y", "--yes", action="store_true",
                   help="with --selector or --all: no confirmation (needed when there "
                        "is no terminal to ask on)")


def add_commands(subparsers: Any) -> None:
    """Register the job commands on `parser.add_subparsers()`."""
    p = controller_command(
        subparsers, "submit", "submit jobs from YAML, TOML or JSON spec files ('-': from stdin)",
        _submit)
    p.add_argument("files", metavar="FILE", nargs="+",
                   help="a spec file, or '-' to read one (YAML or JSON) from standard input; "
                        "all are checked before any is submitted")
    p.add_argument("--id", metavar="JOB_ID", help="the job's id (default: generated)")
    p.add_argument("--wait", action="store_true",
                   help="follow the jobs; exit 0 only if they all succeed")
    examples(p, ("sia submit job.yaml", "prints the new job's id"),
             ("sia submit a.yaml b.yaml --wait", "both, then follow them to the end"),
             ("sia submit job.yaml --id resnet-1", "with an id of one's own"),
             ("cat job.json | sia submit -", "a spec on standard input"))

    p = controller_command(subparsers, "ls", "list jobs, oldest first (by create time, then id)",
                           _ls)
    p.add_argument("--state", type=parse_state, nargs="+", action="extend", metavar="STATE",
                   help="only jobs in these states (queued, running, ...)")
    p.add_argument("--tenant", default="", metavar="T", help="only this tenant's jobs")
    output_flag(p, "a table")
    examples(p, ("sia ls", "every job, oldest first"),
             ("sia ls --state queued running -o wide", "with queue, priority, batch, goodput"),
             ("sia ls --tenant team-a -o json", "the proto3 JSON mapping, for scripts"),
             ("sia --controller ctl-a:50051,ctl-b:50051 ls", "a controller pair (flags "
                                                               "before or after COMMAND)"))

    p = controller_command(subparsers, "get", "show one job", _get)
    p.add_argument("job", metavar="JOB", help="the job's id")
    output_flag(p, "a readable YAML view whose spec is a spec file")
    examples(p, ("sia get resnet-1", "readable YAML; its spec is a spec file"),
             ("sia get resnet-1 -o json", "the whole Job message"),
             ("sia get resnet-1 -o wide", "one row of 'sia ls -o wide'"))

    p = controller_command(subparsers, "cancel", "cancel jobs (they stay listed as CANCELLED): "
                                                 "by id, by label, or all", _cancel)
    _selection_flags(p, "every active job")
    examples(p, ("sia cancel resnet-1", "one job"),
             ("sia cancel resnet-1 bert-2 gpt-3", "several: one line each"),
             ("sia cancel -l team=nlp", "every active job labelled team=nlp (asks first)"),
             ("sia cancel --all --yes", "every active job, without asking"))

    p = controller_command(subparsers, "delete",
                           "remove finished jobs' records: by id, by label, or all", _delete)
    _selection_flags(p, "every finished job")
    examples(p, ("sia delete resnet-1", "one finished job's record"),
             ("sia delete -l team=nlp --yes", "every finished job labelled team=nlp"))

    p = controller_command(subparsers, "watch", "follow jobs live: a table redrawn in place on a "
                                                "terminal, else one line per change (Ctrl-C to "
                                                "stop)", _watch)
    p.add_argument("job", metavar="JOB", nargs="?", help="only this job (default: all)")
    p.add_argument("--events", action="store_true",
                   help="one line per change even on a terminal")
    examples(p, ("sia watch", "every job, redrawn in place"),
             ("sia watch resnet-1 --events", "one job, a line per change"))
