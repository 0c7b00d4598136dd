"""Which process holds a claim, and whether that process is gone: what lets a restart on the same host take the
claims of a killed process at once instead of waiting out their leases.

Every claim id begins with its process's owner tag, ``HOST.PID.START`` (hex): this boot of this machine as seen
from this PID namespace (a hash of ``boot_id`` and the namespace's inode), the PID, and its start time in clock
ticks. A tag of this host whose PID no longer runs with that start time is dead; another host's tag, a malformed
one, or any doubt counts as alive. Without ``/proc`` the tag is empty. Safe from any thread.
"""

from __future__ import annotations

import functools
import hashlib
import os

__all__ = ["TAG_SEPARATOR", "owner_is_alive", "owner_is_dead", "owner_tag"]

#: What ends the owner tag in a claim id (the random part follows).
TAG_SEPARATOR = "-"


def _start_ticks(pid: int | str) -> tuple[int, str] | None:
    """``(start time in clock ticks, state letter)`` of process ``pid``; ``None`` when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after the command name, which may hold spaces and parentheses
    try:
        return int(fields[19]), fields[0]  # field 22 (starttime) and field 3 (state) of proc(5)
    except (IndexError, ValueError):
        return None


@functools.cache
def _host_id() -> str:
    """This boot of this machine, as seen from this PID namespace (8 hex digits); ``""`` when unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as boot:
            boot_id = boot.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return hashlib.sha256(boot_id + b"/" + str(namespace).encode()).hexdigest()[:8]


def owner_tag() -> str:
    """This process's owner tag (``""`` where the host or the start time cannot be known)."""
    return _tag_of(os.getpid())


@functools.cache
def _tag_of(pid: int) -> str:
    """The owner tag of this process, whose PID is ``pid`` (a forked child asks with its own)."""
    host = _host_id()
    started = _start_ticks("self")
    return f"{host}.{pid:x}.{started[0]:x}" if host and started else ""


def _local_process(tag: str) -> tuple[int, int] | None:
    """The PID and start time of owner ``tag`` when it names a process of this host; ``None`` otherwise."""
    host, pid_hex, start_hex = [*tag.split("."), "", "", ""][:3]
    if not host or host != _host_id():
        return None
    try:
        pid, start = int(pid_hex, 16), int(start_hex, 16)
    except ValueError:
        return None
    return (pid, start) if pid > 0 else None


def _runs(pid: int, start: int) -> bool:
    found = _start_ticks("self" if pid == os.getpid() else pid)
    return found is not None and found[0] == start and found[1] not in ("Z", "X")


def owner_is_alive(tag: str) -> bool:
    """Whether owner ``tag`` is a process of this host known to run (this one included)."""
    local = _local_process(tag)
    return local is not None and _runs(*local)


def owner_is_dead(tag: str) -> bool:
    """Whether owner ``tag`` is a process of this host known to be gone (or a zombie)."""
    local = _local_process(tag)
    return local is not None and not _runs(*local)
