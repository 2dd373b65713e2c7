"""Hosts on one machine: network namespaces on a private /24 bridged in the root namespace.

For multi-host tests of any backend (the PostgreSQL and Redis backends' own
namespace tests use it): put the store on the bridge address, run one worker
per namespace (``python -m mayfly_contract._nsworker`` is a real
:class:`mayfly.worker.Worker` with short leases), and cut links. Needs root
and ``ip`` (iproute2).

:class:`Hosts` creates a bridge in the root namespace holding the /24's first
address, and ``count`` namespaces ``mfly-<pid>-<n>``, each joined to the
bridge by a veth pair, with its own address and ``lo`` up. A process started
with :meth:`Hosts.command` runs in one of them and reaches the root namespace
only through its veth; :meth:`Hosts.cut` takes the root-side end down (the
namespace's own interface stays up, so its packets are lost, not refused: a
partition, not a crash), :meth:`Hosts.restore` brings it back.
:meth:`Hosts.destroy` kills whatever still runs in the namespaces and deletes
them and the bridge; it is safe to call on a half-built set.

:func:`netns_problem` says why namespaces cannot be made here (not root, no
``ip``), or ``None``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from typing import Final, final

_PREFIX: Final = "mfly"
_SUBNETS: Final = ipaddress.IPv4Network("10.213.0.0/16")


def _ip(*arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *arguments], capture_output=True, text=True, timeout=30, check=check)


def netns_problem() -> str | None:
    """Why network namespaces cannot be created here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); these tests run as root in CI"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"{_PREFIX}-{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> None:
    """Delete namespaces and bridges a killed earlier session of these tests left behind."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ", 1)[0]
        parts = name.split("-")
        if len(parts) >= 3 and parts[0] == _PREFIX and parts[1].isdigit() and not _alive(int(parts[1])):
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0]
        if name.startswith("mfb") and name[3:].isdigit() and not _alive(int(name[3:])):
            _ip("link", "del", name, check=False)


def _kill_inside(namespace: str) -> None:
    pids = _ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _used_subnets() -> set[ipaddress.IPv4Network]:
    used: set[ipaddress.IPv4Network] = set()
    for line in _ip("-o", "-4", "addr", "show", check=False).stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            used.add(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    return used


@final
class Hosts:
    """A bridge and ``count`` network namespaces on a free 10.213.x.0/24; :meth:`destroy` removes them."""

    def __init__(self, count: int) -> None:
        pid = os.getpid()
        self.bridge = f"mfb{pid}"
        self.names = [f"{_PREFIX}-{pid}-{n}" for n in range(count)]
        self._veths = [f"mfh{pid}n{n}" for n in range(count)]
        used = _used_subnets()
        subnets: list[ipaddress.IPv4Network] = list(_SUBNETS.subnets(new_prefix=24))
        start = pid % 200 + 20
        choice = next((s for s in subnets[start:] + subnets[:start] if s not in used), None)
        if choice is None:
            raise RuntimeError("no free 10.213.x.0/24 subnet for the test namespaces")
        self.subnet = choice
        hosts = list(choice.hosts())
        self.gateway = str(hosts[0])
        """The root namespace's address on the bridge: servers listen here."""
        self.addresses = [str(hosts[10 + n]) for n in range(count)]
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge", "forward_delay", "0")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for name, veth, address in zip(self.names, self._veths, self.addresses, strict=True):
            _ip("netns", "add", name)
            inner = f"{veth}i"
            _ip("link", "add", veth, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", name)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", name, "link", "set", inner, "name", "eth0")
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")

    def command(self, n: int, *argv: str) -> list[str]:
        """``argv`` run inside namespace ``n``."""
        return ["ip", "netns", "exec", self.names[n], *argv]

    def cut(self, n: int) -> None:
        """Partition namespace ``n``: its root-side veth goes down, its packets are dropped."""
        _ip("link", "set", self._veths[n], "down")

    def restore(self, n: int) -> None:
        """Heal namespace ``n``'s partition and wait until the bridge forwards its port again."""
        _ip("link", "set", self._veths[n], "up")
        deadline = time.monotonic() + 30
        while "forwarding" not in _ip("-d", "link", "show", self._veths[n]).stdout:
            if time.monotonic() > deadline:
                raise RuntimeError(f"bridge port {self._veths[n]} did not forward within 30 s")
            time.sleep(0.02)

    def destroy(self) -> None:
        """Kill the processes left in the namespaces, delete them and the bridge (missing pieces are fine)."""
        for name in self.names:
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
        for veth in self._veths:
            _ip("link", "del", veth, check=False)
        _ip("link", "del", self.bridge, check=False)
