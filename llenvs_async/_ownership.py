"""Who owns a leakable resource (a container, a sandbox, an engine process) and whether that
owner still runs, so leaks can be found and reaped.

An owner is ``host:pid`` plus the pid's start ticks, the boot id and the PID-namespace
inode: several processes (Ray workers, containers sharing one engine socket, machines
with one hostname) can share a host name and a pid, but not all four. Only an owner in
this boot and this PID namespace can be checked; any other may be alive.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "OWNER_BOOT_LABEL",
    "OWNER_LABEL",
    "OWNER_LABELS",
    "OWNER_PIDNS_LABEL",
    "OWNER_START_LABEL",
    "SESSION_LABEL",
    "Owner",
    "checkable",
    "current_owner",
    "owner_gone",
    "new_session_id",
    "owner_filters",
    "owner_labels",
    "process_alive",
    "process_stat",
]

OWNER_LABEL = "llenvs.owner"
OWNER_START_LABEL = "llenvs.owner.start"
OWNER_BOOT_LABEL = "llenvs.owner.boot"
OWNER_PIDNS_LABEL = "llenvs.owner.pidns"
OWNER_LABELS = (OWNER_LABEL, OWNER_START_LABEL, OWNER_BOOT_LABEL, OWNER_PIDNS_LABEL)
SESSION_LABEL = "llenvs.session"


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """The process that created a container: host name, pid, the pid's start time, the
    boot id and the PID namespace.

    The start time (clock ticks since boot, Linux) tells a live owner from a reused pid;
    the boot id and PID-namespace inode tell whether this process can check it at all.
    Empty fields are unknown (labels written before they existed, or not Linux).
    """

    host: str
    pid: int
    start: str = ""
    boot: str = ""
    pidns: str = ""

    @property
    def label(self) -> str:
        return f"{self.host}:{self.pid}"

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Owner | None:
        """Parse the owner labels of a container; ``None`` when they are missing or malformed."""
        host, sep, pid = labels.get(OWNER_LABEL, "").rpartition(":")
        if not sep or not host or not pid.isdigit():
            return None
        return cls(
            host=host,
            pid=int(pid),
            start=labels.get(OWNER_START_LABEL, ""),
            boot=labels.get(OWNER_BOOT_LABEL, ""),
            pidns=labels.get(OWNER_PIDNS_LABEL, ""),
        )

    @property
    def marker(self) -> str:
        """The owner as one string (``key=value`` labels joined by commas), for where labels
        do not fit, e.g. an environment variable its child processes inherit."""
        return ",".join(f"{key}={value}" for key, value in self.labels.items())

    @classmethod
    def from_marker(cls, marker: str) -> Owner | None:
        """Parse ``marker``; ``None`` when it is malformed."""
        return cls.from_labels(dict(item.partition("=")[::2] for item in marker.split(",")))

    @property
    def labels(self) -> dict[str, str]:
        """The owner labels a container of this owner carries (unknown fields left out)."""
        labels = {OWNER_LABEL: self.label}
        for key, value in (
            (OWNER_START_LABEL, self.start),
            (OWNER_BOOT_LABEL, self.boot),
            (OWNER_PIDNS_LABEL, self.pidns),
        ):
            if value:
                labels[key] = value
        return labels


def process_stat(pid: int) -> tuple[str, str] | None:
    """``(state, start ticks)`` of ``pid`` from ``/proc``; ``None`` when unknown (no such
    process, or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _start_ticks(pid: int) -> str:
    stat = process_stat(pid)
    return stat[1] if stat else ""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    """The inode of this process's PID namespace (``/proc/self/ns/pid -> pid:[N]``)."""
    try:
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    except OSError:
        return ""


def current_owner() -> Owner:
    """This process as an owner (computed on each call: a forked child is a new owner)."""
    pid = os.getpid()
    return Owner(
        host=socket.gethostname(),
        pid=pid,
        start=_start_ticks(pid),
        boot=_boot_id(),
        pidns=_pid_namespace(),
    )


def new_session_id() -> str:
    return uuid.uuid4().hex[:12]


def owner_labels(session_id: str) -> dict[str, str]:
    """The labels every container created by this process carries."""
    return {**current_owner().labels, SESSION_LABEL: session_id}


def owner_filters(owner: Owner) -> list[str]:
    """Docker label filters (ANDed) that match exactly the containers of ``owner``."""
    return [f"{key}={value}" for key, value in owner.labels.items()]


def checkable(owner: Owner) -> bool:
    """Whether this process can tell if ``owner`` runs: same host, and (when recorded)
    same boot and same PID namespace. A pid seen from another namespace or boot names
    some other process, so such an owner is never provably gone.
    """
    here = current_owner()
    return (
        owner.host == here.host
        and (not owner.boot or owner.boot == here.boot)
        and (not owner.pidns or owner.pidns == here.pidns)
    )


def process_alive(owner: Owner) -> bool:
    """Whether ``owner`` may still run: an owner this process cannot check (another host,
    boot or PID namespace) counts as alive; a reused pid and a zombie (dead, not yet waited
    for by its parent) count as gone.
    """
    if not checkable(owner):
        return True
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    state, start = process_stat(owner.pid) or ("", "")
    if state == "Z":
        return False
    return not owner.start or not start or start == owner.start


def owner_gone(owner: Owner, *, force: bool = False) -> bool:
    """Whether what ``owner`` made may be reaped: it provably stopped running, or it cannot
    be checked from here (another host, boot or PID namespace) and ``force`` says to."""
    return not process_alive(owner) if checkable(owner) else force
