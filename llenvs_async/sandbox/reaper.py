"""Leak-proofing for gVisor sandboxes and checkpoint images: removal without an event loop
(this process's at exit, registered with the one ``atexit`` backstop), and
``reap_orphan_sandboxes`` for dead owners' (``llenvs_async.reap_all_orphans`` sweeps every
kind, these included).

A sandbox's owner is in its OCI annotations (the container labels); a checkpoint image's
in ``owner.json`` next to it. Both live under the machine's one runsc state root.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._backstop import register_removal
from .._ownership import SESSION_LABEL, Owner, current_owner, owner_gone
from .runsc import Runsc, find_runsc

__all__ = [
    "ReapedSandbox",
    "list_sandboxes",
    "reap_orphan_sandboxes",
    "register_sandbox_backstop",
    "remove_own_sandboxes_sync",
    "remove_sandbox_sync",
    "write_owner",
]

_OWNER_FILE = "owner.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapedSandbox:
    """A sandbox (``kind="sandbox"``), checkpoint image (``"checkpoint"``) or bundle of a
    start cut off before runsc recorded it (``"bundle"``) removed."""

    id: str
    kind: str
    owner: str
    session: str


def remove_sandbox_sync(runsc: Runsc, sandbox_id: str) -> None:
    """Kill and delete a sandbox and its bundle (a missing one is fine)."""
    runsc.call_sync("kill", sandbox_id, "KILL")
    done = runsc.call_sync("delete", "-force", sandbox_id)
    if done.returncode != 0 and sandbox_id in _ids(runsc):
        raise OSError(f"runsc delete {sandbox_id} failed: {done.stderr.strip()[-300:]}")
    kill_bundle_processes(runsc.bundles / sandbox_id)
    shutil.rmtree(runsc.bundles / sandbox_id, ignore_errors=True)


def kill_bundle_processes(bundle: Path) -> int:
    """SIGKILL the runsc processes of ``bundle`` that runsc does not know (a start cut off
    before it recorded the sandbox); how many."""
    mark = f"--bundle={bundle}".encode()
    killed = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in argv and os.path.basename(argv[0]).startswith(b"runsc"):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def _ids(runsc: Runsc) -> set[str]:
    return {str(item.get("id")) for item in list_sandboxes(runsc)}


def list_sandboxes(runsc: Runsc) -> list[dict[str, Any]]:
    """``runsc list`` of the state root (id, status, annotations...)."""
    done = runsc.call_sync("list", "-format=json")
    if done.returncode != 0:
        raise OSError(f"runsc list failed: {done.stderr.strip()[-300:]}")
    listing = json.loads(done.stdout or "[]") or []
    return [item for item in listing if isinstance(item, dict)]


def write_owner(directory: Path, labels: Mapping[str, str]) -> None:
    """Record who owns a checkpoint image (its labels) next to it."""
    (directory / _OWNER_FILE).write_text(json.dumps(dict(labels)))


def _checkpoint_owners(runsc: Runsc) -> list[tuple[Path, Mapping[str, str]]]:
    found: list[tuple[Path, Mapping[str, str]]] = []
    for directory in sorted(runsc.checkpoints.iterdir()) if runsc.checkpoints.exists() else []:
        try:
            labels = json.loads((directory / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            labels = {}
        found.append((directory, labels if isinstance(labels, dict) else {}))
    return found


def _mine(labels: Mapping[str, str]) -> bool:
    here = current_owner().labels
    return all(labels.get(key) == value for key, value in here.items())


def remove_own_sandboxes_sync(runsc: Runsc) -> list[str]:
    """Remove every sandbox and checkpoint image of this process, without an event loop."""
    return [removed.id for removed in _remove_where(runsc, _mine)]


def _remove_where(runsc: Runsc, wanted: Callable[[Mapping[str, str]], bool]) -> list[ReapedSandbox]:
    """Remove the sandboxes, checkpoint images and unrecorded bundles whose labels are
    ``wanted``."""

    def reaped(kind: str, name: str, labels: Mapping[str, str]) -> ReapedSandbox:
        owner = Owner.from_labels(labels)
        return ReapedSandbox(id=name, kind=kind, owner=owner.label if owner else "",
                             session=str(labels.get(SESSION_LABEL, "")))  # fmt: skip

    removed = []
    for item in list_sandboxes(runsc):
        if wanted(labels := item.get("annotations") or {}):
            remove_sandbox_sync(runsc, str(item["id"]))
            removed.append(reaped("sandbox", str(item["id"]), labels))
    for directory, labels in _checkpoint_owners(runsc):
        if wanted(labels):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(reaped("checkpoint", directory.name, labels))
    live = _ids(runsc)
    for bundle in runsc.bundles.iterdir() if runsc.bundles.exists() else []:
        if bundle.name not in live and wanted(labels := _bundle_labels(bundle)):
            kill_bundle_processes(bundle)  # a start cut off before runsc recorded it
            shutil.rmtree(bundle, ignore_errors=True)
            removed.append(reaped("bundle", bundle.name, labels))
    return removed


def _bundle_labels(bundle: Path) -> Mapping[str, str]:
    try:
        labels = json.loads((bundle / "config.json").read_text()).get("annotations", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return labels if isinstance(labels, dict) else {}


def register_sandbox_backstop(runsc: Runsc) -> None:
    """Arm the ``atexit`` removal of this process's sandboxes under ``runsc.root``."""
    remove = functools.partial(remove_own_sandboxes_sync, runsc)
    register_removal("hosts", "leftover sandbox(es)", str(runsc.root), remove)


def _orphaned(labels: Mapping[str, str], force: bool) -> bool:
    owner = Owner.from_labels(labels)
    if owner is None:
        return False
    return owner_gone(owner, force=force)


def reap_orphan_sandboxes(
    runsc: Runsc | None = None, *, force: bool = False
) -> list[ReapedSandbox]:
    """Remove sandboxes, checkpoint images and bundles whose owner process is provably gone
    (same rule as ``reap_orphans`` for containers; ``force``: also owners this process
    cannot check)."""
    return _remove_where(runsc or find_runsc(), lambda labels: _orphaned(labels, force))
