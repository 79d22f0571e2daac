"""Container labels that identify the owning process, so leaks can be found and reaped."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "OWNER_LABEL",
    "OWNER_START_LABEL",
    "SESSION_LABEL",
    "Owner",
    "current_owner",
    "new_session_id",
    "owner_labels",
    "process_alive",
]

OWNER_LABEL = "llenvs.owner"
OWNER_START_LABEL = "llenvs.owner.start"
SESSION_LABEL = "llenvs.session"


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """The process that created a container: host name, pid and the pid's start time.

    The start time (clock ticks since boot, Linux) tells a live owner from a reused pid.
    """

    host: str
    pid: int
    start: str = ""

    @property
    def label(self) -> str:
        return f"{self.host}:{self.pid}"

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Owner | None:
        """Parse the owner labels of a container; ``None`` when they are missing or malformed."""
        host, sep, pid = labels.get(OWNER_LABEL, "").rpartition(":")
        if not sep or not host or not pid.isdigit():
            return None
        return cls(host=host, pid=int(pid), start=labels.get(OWNER_START_LABEL, ""))


def _start_ticks(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return ""
    return fields[19] if len(fields) > 19 else ""


def current_owner() -> Owner:
    """This process as an owner (computed on each call: a forked child is a new owner)."""
    pid = os.getpid()
    return Owner(host=socket.gethostname(), pid=pid, start=_start_ticks(pid))


def new_session_id() -> str:
    return uuid.uuid4().hex[:12]


def owner_labels(session_id: str) -> dict[str, str]:
    """The labels every container created by this process carries."""
    owner = current_owner()
    labels = {OWNER_LABEL: owner.label, SESSION_LABEL: session_id}
    if owner.start:
        labels[OWNER_START_LABEL] = owner.start
    return labels


def process_alive(owner: Owner) -> bool:
    """Whether ``owner`` (a process on this host) still runs; a reused pid counts as gone."""
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not owner.start:
        return True
    start = _start_ticks(owner.pid)
    return not start or start == owner.start
