"""What a backend on local files needs to know about the filesystem under it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["VOLATILE_FILESYSTEMS", "filesystem_type"]

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
