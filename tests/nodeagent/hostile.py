"""A hostile tenant's job: every attack of issue 36 against a victim job of another
tenant and against the agent, each recorded as blocked (with the error) or DONE.

Run by the agent as a job's command (tests/nodeagent/test_isolation.py). What it
attacks comes in its environment (the job spec's `env`): the victim's pid, its
checkpoint folder, its gate socket, its log, the agent's work directory and key.
It writes `attacks.json` to its own checkpoint folder, leaves a setsid'd process
behind (its pid in the file) and then waits to be stopped.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

E = os.environ
out = E["SIA_CHECKPOINT_DIR"]
results = {}


def attempt(name, fn):
    try:
        fn()
    except Exception as exc:  # blocked: by which error
        results[name] = f"blocked: {type(exc).__name__}: {exc}"
    else:
        results[name] = "DONE"


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)


def agent_key_in_env():
    leaked = [k for k in E if k.startswith("SIA_TLS") or "TOKEN" in k and k != "SIA_AGENT_TOKEN"
              or k == "AGENT_SECRET"]
    if leaked:
        return
    raise LookupError("no agent credential in the environment")


def send_report_in_victims_name():
    # Through the victim's own gate (its folder is the victim's alone).
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(E["VICTIM_SOCKET"])
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    if not s.recv(64):  # closed at once: refused
        raise ConnectionRefusedError("the gate closed the connection")


def move_out_of_cgroup():
    procs = [line.split(":", 2)[2] for line in read("/proc/self/cgroup").decode().splitlines()
             if ":memory:" in line]
    parent = os.path.dirname(procs[0].rstrip("/"))
    write(f"/sys/fs/cgroup/memory{parent}/cgroup.procs", str(os.getpid()).encode())


def widen_affinity():
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    if len(os.sched_getaffinity(0)) < (os.cpu_count() or 1):
        raise PermissionError(f"affinity stays {sorted(os.sched_getaffinity(0))}")


def many_processes():
    kids = []
    try:
        for _ in range(int(E.get("FORKS", "64"))):
            kids.append(subprocess.Popen(["sleep", "30"]))
    finally:
        for k in kids:
            k.kill()
            k.wait()


victim = int(E["VICTIM_PID"])
attempt("read the agent's key file", lambda: read(E["AGENT_KEY"]))
attempt("find an agent credential in the environment", agent_key_in_env)
attempt("read the victim's environment", lambda: read(f"/proc/{victim}/environ"))
attempt("read the victim's memory", lambda: read(f"/proc/{victim}/mem"))
attempt("read the agent's environment", lambda: read(f"/proc/{E['AGENT_PID']}/environ"))


def parents_environment():
    # In a sandbox the parent is the job's own bwrap: readable, and holding nothing.
    if b"hunter2" not in read(f"/proc/{os.getppid()}/environ"):
        raise LookupError("its parent's environment holds no agent secret")


attempt("find an agent secret in its parent's environment", parents_environment)
attempt("SIGKILL the victim", lambda: os.kill(victim, signal.SIGKILL))
attempt("signal the agent", lambda: os.kill(int(E["AGENT_PID"]), signal.SIGUSR2))
attempt("plant a checkpoint in the victim's folder",
        lambda: write(os.path.join(E["VICTIM_CKPT"], "ckpt-gen99.pt")))
attempt("list the victim's checkpoints", lambda: os.listdir(E["VICTIM_CKPT"]))
attempt("write into the agent's work folder",
        lambda: write(os.path.join(E["AGENT_WORKDIR"], "planted")))
attempt("forge the victim's log", lambda: write(E["VICTIM_LOG"], b"forged"))
attempt("report in the victim's name", send_report_in_victims_name)
attempt("move out of its cgroup", move_out_of_cgroup)
attempt("widen its CPU affinity", widen_affinity)
attempt("start more processes than its limit", many_processes)

# Leave a process behind that no longer belongs to the job's process group.
orphan = subprocess.Popen(["setsid", "sleep", "1000"], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(0.2)
results["orphan_pid"] = orphan.pid
results["uid"] = os.getuid()
results["home"] = E.get("HOME", "")
results["tmp"] = E.get("TMPDIR", "")
results["tmp_entries"] = sorted(os.listdir("/tmp"))
tmp = os.path.join(out, ".attacks.json.tmp")
with open(tmp, "w") as f:
    json.dump(results, f)
os.replace(tmp, os.path.join(out, "attacks.json"))
if E.get("THEN") == "oom":
    hog = bytearray(int(E.get("HOG_MIB", "1024")) << 20)  # more than the job may use
    for i in range(0, len(hog), 4096):
        hog[i] = 1
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
while True:
    time.sleep(0.05)
