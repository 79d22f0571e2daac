"""Find and end vLLM engine processes whose owner is gone.

vLLM's engine core (``VLLM::EngineCore``) and its workers are spawned children that
never watch their parent: an owner killed by SIGKILL or the OOM killer leaves them
running, re-parented to init. ``marked_engine_start`` puts ``LLENVS_VLLM_OWNER`` (the
owner as container labels name one: ``Owner.marker``) in the environment they inherit
(``SPT_NOENV`` keeps vLLM's process title from overwriting it in ``/proc/<pid>/environ``);
``reap_orphan_engines`` reads it back from ``/proc`` and ends every marked process whose
owner is gone by the reapers' one rule (``owner_gone``). Only spawned children carry the
mark (vLLM's CPU platform and an initialised CUDA always spawn;
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` forces it elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .._ownership import Owner, current_owner, owner_gone, process_stat

__all__ = ["OWNER_ENV", "ReapedProcess", "marked_engine_start", "reap_orphan_engines"]

OWNER_ENV = "LLENVS_VLLM_OWNER"
_NOENV = "SPT_NOENV"
_TERM_WAIT = 10.0
_KILL_WAIT = 5.0
_POLL = 0.05
_PROC = "/proc"

_lock = threading.Lock()
_depth = 0
_saved: dict[str, str | None] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapedProcess:
    """One engine process ended because its owner was gone (``name``: its title)."""

    pid: int
    owner_pid: int
    name: str


@contextlib.contextmanager
def marked_engine_start() -> Iterator[None]:
    """Mark the processes started inside as this process's (``LLENVS_VLLM_OWNER``); the
    previous environment comes back when the last concurrent start-up leaves."""
    global _depth
    with _lock:
        if _depth == 0:
            _saved.update({key: os.environ.get(key) for key in (OWNER_ENV, _NOENV)})
            os.environ[OWNER_ENV] = current_owner().marker
            os.environ.setdefault(_NOENV, "1")
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for key, value in _saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
                _saved.clear()


def _owner(pid: int) -> Owner | None:
    try:
        with open(f"{_PROC}/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:  # gone, or another user's process
        return None
    prefix = f"{OWNER_ENV}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return Owner.from_marker(entry[len(prefix) :].decode("ascii", "replace"))
    return None


def _name(pid: int) -> str:
    try:
        with open(f"{_PROC}/{pid}/cmdline", "rb") as f:
            title = f.read().split(b"\0", 1)[0].decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return title


def _orphans(force: bool) -> list[tuple[ReapedProcess, str]]:
    """Marked processes whose owner is gone, with their start ticks (a pid is re-checked
    against them before each signal)."""
    found = []
    for entry in os.listdir(_PROC):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        owner = _owner(pid)
        stat = process_stat(pid)
        if owner is None or stat is None or stat[0] == "Z":
            continue
        if owner_gone(owner, force=force):
            reaped = ReapedProcess(pid=pid, owner_pid=owner.pid, name=_name(pid))
            found.append((reaped, stat[1]))
    return found


def _running(pid: int, start: str) -> bool:
    stat = process_stat(pid)
    return stat is not None and stat[0] != "Z" and stat[1] == start


def _signal_and_wait(
    targets: list[tuple[ReapedProcess, str]], sig: signal.Signals, wait: float
) -> list[tuple[ReapedProcess, str]]:
    """Send ``sig`` to each target still running; the ones still running after ``wait``."""
    for target, start in targets:
        if _running(target.pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(target.pid, sig)
    deadline = time.monotonic() + wait
    left = targets
    while True:
        left = [(t, start) for t, start in left if _running(t.pid, start)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL)


def reap_orphan_engines(*, force: bool = False) -> tuple[ReapedProcess, ...]:
    """End every vLLM engine process marked by ``marked_engine_start`` whose owner is gone:
    SIGTERM, then SIGKILL for those still running after a bounded wait. An engine whose
    owner lives is never touched (``force``: also owners in another PID namespace)."""
    targets = _orphans(force)
    left = _signal_and_wait(targets, signal.SIGTERM, _TERM_WAIT)
    if left:
        _signal_and_wait(left, signal.SIGKILL, _KILL_WAIT)
    return tuple(target for target, _ in targets)
