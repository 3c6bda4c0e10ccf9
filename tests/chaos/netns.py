"""Network namespaces joined to the root namespace by veth pairs, for tests that
partition a node agent from the controller over real sockets.

    with Netns.create(["a", "b"]) as net:   # NetnsUnavailable: the machine can't
        net.exec_argv("a", [...])           # argv that runs a command in "a"
        net.partition("a"); net.heal("a")

Each namespace gets its own veth pair and /30: the root end is the first
address, the namespace end the second. The controller listens on the first
namespace's root-end address (`controller_ip`); every other namespace has a host
route to it through its own veth (the root namespace delivers it locally), so
partitioning one namespace leaves the others, and the root namespace, connected.

A partition takes the namespace's end of its veth down: the namespace loses its
route to the controller and the root end loses carrier, so packets either way
are dropped silently (no RST, no FIN) and open TCP connections stall until the
link comes back, as with a pulled cable. (netem is not needed, which matters on
kernels built without qdiscs.)

Names carry the pid (`sia<pid>a0`, `sia-test-<pid>-a`), leftovers of an earlier
run with the same pid are removed first, and `close()` removes everything even
after a failure; it never raises.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Netns", "NetnsUnavailable"]


class NetnsUnavailable(Exception):
    """Namespaces or veth pairs cannot be set up here; the message says what failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, ["ip", *args], proc.stdout,
                                            proc.stderr)
    return proc


def _routes() -> list[ipaddress.IPv4Network]:
    """The root namespace's IPv4 destinations, to keep clear of."""
    out = []
    for table in ("main", "local"):
        proc = _ip("-4", "route", "show", "table", table, check=False)
        for line in proc.stdout.splitlines():
            words = line.split()
            if not words:
                continue
            dest = words[1] if words[0] in ("local", "broadcast", "unicast") else words[0]
            if dest == "default":
                continue
            try:
                out.append(ipaddress.ip_network(dest, strict=False))
            except ValueError:
                continue
    return out


@dataclass
class _Link:
    ns: str  # namespace name
    root_if: str  # veth end in the root namespace
    ns_if: str  # veth end in the namespace
    net: ipaddress.IPv4Network  # its /30

    @property
    def root_ip(self) -> str:
        return str(self.net.network_address + 1)

    @property
    def ns_ip(self) -> str:
        return str(self.net.network_address + 2)


@dataclass
class Netns:
    links: dict[str, _Link] = field(default_factory=dict)  # by short name

    @property
    def controller_ip(self) -> str:
        """The root-namespace address the controller should listen on."""
        return next(iter(self.links.values())).root_ip

    def ip_of(self, name: str) -> str:
        """The address of namespace `name` (its end of the veth)."""
        return self.links[name].ns_ip

    @classmethod
    def create(cls, names: Sequence[str]) -> Netns:
        """One namespace per short name (a letter or two); NetnsUnavailable when
        the machine does not allow it (nothing is left behind then)."""
        if shutil.which("ip") is None:
            raise NetnsUnavailable("no `ip` command (iproute2) on PATH")
        pid = os.getpid()
        net = cls()
        nets = _pick_subnets(len(names), pid)
        for name, subnet in zip(names, nets, strict=True):
            net.links[name] = _Link(ns=f"sia-test-{pid}-{name}", root_if=f"sia{pid}{name}0",
                                    ns_if=f"sia{pid}{name}1", net=subnet)
        net._remove()  # a killed earlier run with the same pid
        try:
            net._setup()
        except subprocess.CalledProcessError as exc:
            net.close()
            cmd = " ".join(exc.cmd)
            raise NetnsUnavailable(f"{cmd}: {(exc.stderr or '').strip() or exc}") from None
        except (OSError, subprocess.TimeoutExpired) as exc:
            net.close()
            raise NetnsUnavailable(f"ip: {exc}") from None
        return net

    def _setup(self) -> None:
        ctrl = self.controller_ip
        for link in self.links.values():
            _ip("netns", "add", link.ns)
            _ip("link", "add", link.root_if, "type", "veth", "peer", "name", link.ns_if)
            _ip("link", "set", link.ns_if, "netns", link.ns)
            _ip("addr", "add", f"{link.root_ip}/30", "dev", link.root_if)
            _ip("link", "set", link.root_if, "up")
            inside = ("-n", link.ns)
            _ip(*inside, "addr", "add", f"{link.ns_ip}/30", "dev", link.ns_if)
            _ip(*inside, "link", "set", link.ns_if, "up")
            _ip(*inside, "link", "set", "lo", "up")
            if link.root_ip != ctrl:  # the controller's address, through this veth
                _ip(*inside, "route", "add", f"{ctrl}/32", "via", link.root_ip)
            # Entering one (it remounts /sys) can fail where creating one did not.
            _ip("netns", "exec", link.ns, "true")

    def exec_argv(self, name: str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside namespace `name` (`ip netns exec` execs it: same pid)."""
        return ["ip", "netns", "exec", self.links[name].ns, *argv]

    def partition(self, name: str) -> None:
        link = self.links[name]
        _ip("-n", link.ns, "link", "set", link.ns_if, "down")

    def heal(self, name: str) -> None:
        link = self.links[name]
        _ip("-n", link.ns, "link", "set", link.ns_if, "up")
        # Down dropped the namespace's routes through the link; the /30 comes back
        # with the address, the host route to the controller does not.
        if link.root_ip != self.controller_ip:
            _ip("-n", link.ns, "route", "replace", f"{self.controller_ip}/32", "via",
                link.root_ip)

    def _remove(self) -> None:
        for link in self.links.values():
            try:
                _ip("link", "del", link.root_if, check=False)  # takes its peer with it
                _ip("netns", "del", link.ns, check=False)  # and any veth end inside
            except (OSError, subprocess.TimeoutExpired):
                pass

    def close(self) -> None:
        """Remove every namespace and veth this made; never raises."""
        self._remove()

    def leftovers(self) -> list[str]:
        """What `close()` should have removed but is still there."""
        out = []
        try:
            ns = _ip("netns", "list", check=False).stdout.split()
            links = _ip("-o", "link", "show", check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return out
        for link in self.links.values():
            if link.ns in ns:
                out.append(link.ns)
            if f" {link.root_if}@" in links or f" {link.root_if}:" in links:
                out.append(link.root_if)
        return out

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pick_subnets(count: int, pid: int) -> list[ipaddress.IPv4Network]:
    """`count` /30s in 10.200.0.0/16, from a pid-derived start, clear of every
    route the root namespace has (so the host's own networks are never shadowed)."""
    taken = _routes()
    block = ipaddress.ip_network("10.200.0.0/16")
    slots = list(block.subnets(new_prefix=30))
    start = (pid * 7) % len(slots)
    picked: list[ipaddress.IPv4Network] = []
    for k in range(len(slots)):
        cand = slots[(start + k) % len(slots)]
        if any(cand.overlaps(t) for t in taken):
            continue
        picked.append(cand)
        if len(picked) == count:
            return picked
    raise NetnsUnavailable("no free /30 in 10.200.0.0/16 for the veth pairs")
