"""A throwaway multi-node Slurm cluster on this machine, for the Slurm bridge's tests.

From Debian's `slurm-wlm` 22.05 (which `make venv` installs as root where missing):
one `slurmctld` and one `slurmd -N NODE` per emulated node, all on loopback with
ports of their own, `auth/none` (no munge key), typed GPU gres backed by empty
placeholder device files (`gres.conf` needs a file per GPU, or slurmctld marks the
node INVAL). Everything lives in a fresh temporary directory; `stop()` cancels the
jobs, stops the daemons it started (by pid) and removes the directory.

    with SlurmCluster({"rtx-0": ("rtx", 4), "a100-0": ("dgx-ext", 4)}) as slurm:
        slurm.run("sbatch", "--parsable", "--wrap", "true")   # SLURM_CONF set

Slurm's daemons run as root here (`SlurmUser=root`): as another user they cannot
start jobs as anyone, so `unavailable()` says so and the tests skip.

    python -m sia_grpc.testing.slurm      # one for trying things: prints the
                                           # SLURM_CONF to export, runs until Ctrl-C
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from sia_grpc.testing.ports import free_port

__all__ = ["DEFAULT_NODES", "SlurmCluster", "unavailable"]

# Two GPU types as Slurm sites name them; the bridge maps them onto the shipped
# profiles' types as the node agents do (rtx: RTX 2080 Ti; a100 -> dgx-ext), so Sia
# has a real choice of type for the artifact's applications.
DEFAULT_NODES: Mapping[str, tuple[str, int]] = {
    "rtx-0": ("rtx", 4), "rtx-1": ("rtx", 4), "a100-0": ("a100", 4)}
_DAEMONS = ("slurmctld", "slurmd")
_CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
_START_TIMEOUT_S = 60.0


def _binary(name: str) -> str | None:
    """`name` on PATH, or in /usr/sbin (where Debian puts the daemons, off a user's PATH)."""
    sbin = Path("/usr/sbin") / name
    return shutil.which(name) or (str(sbin) if sbin.exists() else None)


def unavailable() -> str | None:
    """Why no cluster can be started here, or None when one can."""
    missing = [n for n in (*_DAEMONS, *_CLIENTS) if _binary(n) is None]
    if missing:
        return (f"no Slurm ({', '.join(missing)} missing): `make venv` installs Debian's "
                f"slurm-wlm as root; elsewhere, install Slurm 22.05 or later")
    if os.geteuid() != 0:
        return "Slurm's daemons must run as root to start jobs, and this is not root"
    return None


class SlurmCluster:
    """A running cluster: `nodes` is node name -> (gres type, GPU count)."""

    def __init__(self, nodes: Mapping[str, tuple[str, int]] = DEFAULT_NODES, *,
                 cpus: int = 8) -> None:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        self.nodes = dict(nodes)
        self.root = Path(tempfile.mkdtemp(prefix="sia-slurm-"))
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._procs: list[subprocess.Popen[bytes]] = []
        try:
            self._write_config(cpus)
            self._start()
        except BaseException:
            self.stop()
            raise

    # -- configuration -------------------------------------------------------------------

    def _write_config(self, cpus: int) -> None:
        r = self.root
        for sub in ("state", "spool", "dev", "log"):
            (r / sub).mkdir()
        lines = [
            "ClusterName=sia-test", "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}",
            "AuthType=auth/none", "CredType=cred/none",
            "SlurmUser=root", "SlurmdUser=root",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "GresTypes=gpu", "MpiDefault=none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill", "ReturnToService=2",
            # The configured CPUs and memory, not the machine's: many nodes on one host.
            "SlurmdParameters=config_overrides",
            # Reschedule soon after a change, so tests wait seconds, not a minute.
            "SchedulerParameters=sched_min_interval=100000,batch_sched_delay=1",
            "MinJobAge=300",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'spool'}/%n.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log'}/%n.log",
        ]
        gres = []
        for name, (gpu_type, count) in self.nodes.items():
            files = r / "dev" / name
            files.mkdir()
            for i in range(count):
                (files / f"gpu{i}").touch()
            lines.append(f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 "
                         f"Port={free_port()} CPUs={cpus} RealMemory=4000 "
                         f"Gres=gpu:{gpu_type}:{count} State=UNKNOWN")
            gres.append(f"NodeName={name} Name=gpu Type={gpu_type} "
                        f"File={files}/gpu[0-{count - 1}]")
        lines.append("PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (r / "gres.conf").write_text("\n".join(gres) + "\n")

    # -- processes -----------------------------------------------------------------------

    def _spawn(self, *argv: str) -> None:
        binary = _binary(argv[0])
        assert binary is not None, f"no {argv[0]} (unavailable() says so first)"
        log = open(self.root / "log" / f"{argv[0]}-{len(self._procs)}.out", "wb")  # noqa: SIM115
        with log:
            self._procs.append(subprocess.Popen(
                [binary, *argv[1:]], env=self.env, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))

    def _start(self) -> None:
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0,
                   "slurmctld to answer")
        for name in self.nodes:
            self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", name)
        self._wait(lambda: set(self.node_states().values()) == {"idle"}, "the nodes to be idle")

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not ready():
            dead = [cast(list[str], p.args)[0] for p in self._procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"{_START_TIMEOUT_S:g} s passed"
                raise RuntimeError(f"Slurm did not start ({why} waiting for {what}):\n"
                                   + self.logs())
            time.sleep(0.2)

    def logs(self) -> str:
        """The daemons' logs, for a failure message."""
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in sorted((self.root / "log").glob("*")) if p.is_file())

    def run(self, *argv: str, check: bool = True,
            timeout: float = 30.0) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (SLURM_CONF set)."""
        return subprocess.run([_binary(argv[0]) or argv[0], *argv[1:]], env=self.env,
                              capture_output=True, text=True, check=check, timeout=timeout)

    def node_states(self) -> dict[str, str]:
        """Node name -> Slurm's state in lower case ("idle", "mixed", "drained", ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        if out.returncode != 0:
            return {}
        pairs = (line.split() for line in out.stdout.splitlines() if line.strip())
        return {n: s.rstrip("*~#!%$@^-").lower() for n, s in pairs}

    def cancel_all(self, timeout: float = 30.0) -> None:
        """Cancel every job and wait until none runs (their processes are not ours)."""
        self.run("scancel", "--user", "root", check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("squeue", "-h", "-t", "running,completing,suspended", "-o", "%i",
                           check=False)
            if out.returncode != 0 or not out.stdout.strip():
                return
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel the jobs, stop the daemons started here and remove the directory."""
        if any(p.poll() is None for p in self._procs):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.cancel_all()
        for p in reversed(self._procs):  # the slurmds, then slurmctld
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=15)
        self._procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leaves the `with`: stopped
    with SlurmCluster() as slurm, contextlib.suppress(KeyboardInterrupt):
        print(f"export SLURM_CONF={slurm.conf}", flush=True)
        signal.pause()


if __name__ == "__main__":
    main()
