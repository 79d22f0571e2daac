"""Leak-proofing for containers: their removal at exit (registered with the one ``atexit``
backstop, ``llenvs_async._backstop``), and ``reap_orphans`` for dead owners'.

The removal at exit uses a synchronous HTTP call on the engine socket, since at exit the
event loop may be gone.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
import os
import socket
import urllib.parse
from dataclasses import dataclass

from .._backstop import register_removal
from .._ownership import (
    OWNER_LABEL,
    SESSION_LABEL,
    Owner,
    current_owner,
    owner_filters,
    owner_gone,
)
from .engine import DockerEngine

__all__ = [
    "ReapedContainer",
    "reap_orphans",
    "register_backstop",
    "remove_container_sync",
    "remove_own_containers_sync",
]

_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapedContainer:
    """A container removed by ``reap_orphans`` and the owner it had."""

    id: str
    name: str
    image: str
    owner: str
    session: str


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _connection(url: str | None, timeout: float) -> http.client.HTTPConnection:
    host = url or os.environ.get("DOCKER_HOST") or ""
    if not host:
        path = next((p for p in _SOCKETS if os.path.exists(p)), _SOCKETS[0])
        return _UnixConnection(path, timeout)
    if host.startswith("unix://"):
        return _UnixConnection(host.removeprefix("unix://"), timeout)
    parsed = urllib.parse.urlsplit(host)
    if parsed.scheme in ("tcp", "http") and parsed.hostname:
        return http.client.HTTPConnection(parsed.hostname, parsed.port or 2375, timeout=timeout)
    raise ValueError(f"the atexit backstop cannot reach DOCKER_HOST={host!r}")


def _request(url: str | None, method: str, path: str, timeout: float) -> bytes:
    conn = _connection(url, timeout)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        body = response.read()
        if response.status >= 400 and response.status != 404:
            raise OSError(f"{method} {path}: HTTP {response.status} {body[:200]!r}")
        return body
    finally:
        conn.close()


def remove_container_sync(
    container_id: str, url: str | None = None, *, timeout: float = 30.0
) -> None:
    """Force-remove one container without an event loop (missing is fine)."""
    _request(url, "DELETE", f"/containers/{container_id}?force=1&v=1", timeout)


def remove_own_containers_sync(url: str | None = None, *, timeout: float = 30.0) -> list[str]:
    """Force-remove every container this process created, without an event loop.

    Matches every owner label (pid, start ticks, boot, PID namespace), so a process with
    the same ``host:pid`` in another namespace sharing the engine keeps its containers.
    """
    query = urllib.parse.urlencode(
        {"all": "1", "filters": json.dumps({"label": owner_filters(current_owner())})}
    )
    listing = json.loads(_request(url, "GET", f"/containers/json?{query}", timeout))
    removed = []
    for item in listing:
        remove_container_sync(str(item["Id"]), url, timeout=timeout)
        removed.append(str(item["Id"]))
    return removed


def register_backstop(url: str | None) -> None:
    """Arm the ``atexit`` removal for containers created through an engine at ``url``."""
    remove = functools.partial(remove_own_containers_sync, url)
    register_removal("hosts", "leftover container(s)", str(url), remove)


async def reap_orphans(
    engine: DockerEngine | None = None, *, force: bool = False, session: str | None = None
) -> list[ReapedContainer]:
    """Remove containers whose owner process is provably gone; return what was removed.

    Provably gone: on this host, in this boot and PID namespace, and its pid is free or
    reused. Containers of live owners are always left alone; those of owners this process
    cannot check (another host, boot or PID namespace: maybe a live run sharing the
    engine) are left too, unless ``force`` (the caller knows no such run is live).
    ``session`` limits the sweep to the containers of one session.
    """
    if engine is None:
        async with DockerEngine() as own:
            return await reap_orphans(own, force=force, session=session)
    orphans: list[ReapedContainer] = []
    wanted: dict[str, str | None] = {OWNER_LABEL: None}
    if session is not None:
        wanted[SESSION_LABEL] = session
    for item in await engine.list_containers(wanted):
        labels = item.get("Labels") or {}
        owner = Owner.from_labels(labels)
        if owner is None:
            continue
        if not owner_gone(owner, force=force):
            continue
        names = item.get("Names") or [""]
        orphans.append(
            ReapedContainer(
                id=str(item["Id"]),
                name=str(names[0]).lstrip("/"),
                image=str(item.get("Image", "")),
                owner=owner.label,
                session=str(labels.get(SESSION_LABEL, "")),
            )
        )
    async with asyncio.TaskGroup() as tg:
        removals = [tg.create_task(engine.remove_container(c.id)) for c in orphans]
    return [c for c, task in zip(orphans, removals, strict=True) if task.result()]
