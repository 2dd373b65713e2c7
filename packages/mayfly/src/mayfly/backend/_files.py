"""What a backend on local files needs to know about the filesystem under it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["PROC_LOCKS", "VOLATILE_FILESYSTEMS", "filesystem_type", "held_flocks", "parse_held_flocks"]

PROC_LOCKS: Final = "/proc/locks"
"""Where Linux lists the file locks held on the host (those of processes this one can see)."""

VOLATILE_FILESYSTEMS: Final = frozenset({"tmpfs", "ramfs"})
"""Filesystems whose fsync protects nothing: their contents vanish with the host.

A backend asked for host-crash durability on one of them refuses to open
(``DurabilityUnavailable``) rather than acknowledge what a reboot loses.
"""


def filesystem_type(path: Path, mountinfo: str | None = None) -> str | None:
    """The type of the filesystem holding ``path`` (``ext4``, ``tmpfs``...), or None if unknown.

    Read from ``/proc/self/mountinfo`` (Linux) unless ``mountinfo`` text is given:
    the longest mount point containing the resolved path wins.
    """
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
                mountinfo = mounts.read()
        except OSError:
            return None
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-")
            # Mount points escape space, tab, newline and backslash as octal (\040).
            mount_point = fields[4].encode("latin-1").decode("unicode_escape")
            fstype = fields[separator + 1]
        except (ValueError, IndexError, UnicodeError):
            continue
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) >= best[0]):
            best = (len(mount_point), fstype)
    return best[1] if best else None


def held_flocks(path: str = PROC_LOCKS) -> dict[int, set[int]] | None:
    """Inode -> pids holding an exclusive ``flock`` on it, read from ``/proc/locks``; None if unreadable.

    Reading it takes no lock: a store can tell which of its lock files are
    held without probing each (a probe is a lock of its own, which a
    concurrent non-blocking grant would meet and be refused by). Only
    processes of this PID namespace are listed, with their pids as this
    process sees them.
    """
    try:
        with open(path, encoding="ascii", errors="replace") as locks:
            return parse_held_flocks(locks.read())
    except OSError:
        return None


def parse_held_flocks(text: str) -> dict[int, set[int]]:
    """Inode -> pids holding an exclusive ``flock`` on it, from ``/proc/locks`` text (waiters left out).

    A line reads ``1: FLOCK  ADVISORY  WRITE 4242 fd:00:1474578 0 EOF`` (the
    device's major and minor in hex, then the inode); a waiter's line has
    ``->`` after the number. The device is not compared: a btrfs subvolume or
    an overlay reports another device to ``stat`` than to ``/proc/locks``, so
    a caller matches the holder's pid too.
    """
    held: dict[int, set[int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        try:
            pid = int(fields[4])
            inode = int(fields[5].rsplit(":", 1)[1])
        except (ValueError, IndexError):
            continue
        held.setdefault(inode, set()).add(pid)
    return held
