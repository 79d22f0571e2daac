"""Snapshot images (``Container.commit`` of a live episode): ownership labels, removal, reaping.

A snapshot image carries its owner process and session under ``llenvs.snapshot.*``
keys, not the container keys (``llenvs.owner``): a container started from the image
must not inherit an owner by accident. ``reap_orphan_snapshots`` removes the images
whose owner is gone; the one ``atexit`` backstop removes this process's containers, then
its snapshot images, if the event loop dies before ``aclose``.
"""

from __future__ import annotations

import functools
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._backstop import register_removal
from .._ownership import OWNER_LABEL, OWNER_START_LABEL, Owner, current_owner, process_alive
from ..errors import ContainerError
from .engine import DockerEngine
from .reaper import _request, register_backstop

__all__ = [
    "CommittedImage",
    "SNAPSHOT_OWNER_LABEL",
    "SNAPSHOT_OWNER_START_LABEL",
    "SNAPSHOT_SESSION_LABEL",
    "SNAPSHOT_SOURCE_LABEL",
    "ReapedImage",
    "list_snapshot_images",
    "reap_orphan_snapshots",
    "register_snapshot_backstop",
    "remove_image",
    "remove_own_snapshot_images_sync",
    "snapshot_labels",
]

SNAPSHOT_OWNER_LABEL = "llenvs.snapshot.owner"
SNAPSHOT_OWNER_START_LABEL = "llenvs.snapshot.owner.start"
SNAPSHOT_SESSION_LABEL = "llenvs.snapshot.session"
SNAPSHOT_SOURCE_LABEL = "llenvs.snapshot.source"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedImage:
    """A fork point that is a commit of a box's filesystem: ``image`` starts the copies."""

    image: str

    @property
    def name(self) -> str:
        return self.image


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapedImage:
    """A snapshot image removed by ``reap_orphan_snapshots`` and the owner it had."""

    id: str
    tags: tuple[str, ...]
    owner: str
    session: str


def snapshot_labels(session_id: str, source: str) -> dict[str, str]:
    """Labels for a snapshot image made now by this process, of an image ``source``."""
    owner = current_owner()
    labels = {
        SNAPSHOT_OWNER_LABEL: owner.label,
        SNAPSHOT_SESSION_LABEL: session_id,
        SNAPSHOT_SOURCE_LABEL: source,
    }
    if owner.start:
        labels[SNAPSHOT_OWNER_START_LABEL] = owner.start
    return labels


def _owner(labels: Mapping[str, str]) -> Owner | None:
    return Owner.from_labels(
        {
            OWNER_LABEL: labels.get(SNAPSHOT_OWNER_LABEL, ""),
            OWNER_START_LABEL: labels.get(SNAPSHOT_OWNER_START_LABEL, ""),
        }
    )


async def list_snapshot_images(
    engine: DockerEngine, *, owner: str | None = None, session: str | None = None
) -> list[dict[str, Any]]:
    """Snapshot images, optionally only those of one owner (``"host:pid"``) or session."""
    wanted = [SNAPSHOT_OWNER_LABEL if owner is None else f"{SNAPSHOT_OWNER_LABEL}={owner}"]
    if session is not None:
        wanted.append(f"{SNAPSHOT_SESSION_LABEL}={session}")
    params = {"filters": json.dumps({"label": wanted})}
    result: list[dict[str, Any]] = await engine.request_json(
        "GET", "images/json", params=params, action="listing snapshot images"
    )
    return result


async def remove_image(engine: DockerEngine, ref: str) -> bool:
    """Force-remove an image by name or id; ``False`` when it was already gone."""
    return await engine.remove_image(ref)


async def reap_orphan_snapshots(engine: DockerEngine) -> list[ReapedImage]:
    """Remove snapshot images whose owner process on this host is gone (after its containers:
    an image a running container uses cannot be removed and is left for a later reap)."""
    here = current_owner().host
    reaped: list[ReapedImage] = []
    for item in await list_snapshot_images(engine):
        labels = item.get("Labels") or {}
        owner = _owner(labels)
        if owner is None or owner.host != here or process_alive(owner):
            continue
        try:
            removed = await remove_image(engine, str(item["Id"]))
        except ContainerError as exc:
            if exc.status == 409:  # still used by a running container
                continue
            raise
        if removed:
            reaped.append(
                ReapedImage(
                    id=str(item["Id"]),
                    tags=tuple(item.get("RepoTags") or ()),
                    owner=owner.label,
                    session=str(labels.get(SNAPSHOT_SESSION_LABEL, "")),
                )
            )
    return reaped


def remove_own_snapshot_images_sync(url: str | None = None, *, timeout: float = 30.0) -> list[str]:
    """Force-remove every snapshot image this process made, without an event loop."""
    label = f"{SNAPSHOT_OWNER_LABEL}={current_owner().label}"
    query = urllib.parse.urlencode({"filters": json.dumps({"label": [label]})})
    listing = json.loads(_request(url, "GET", f"/images/json?{query}", timeout))
    for item in listing:
        _request(url, "DELETE", f"/images/{item['Id']}?force=1", timeout)
    return [str(item["Id"]) for item in listing]


def register_snapshot_backstop(url: str | None) -> None:
    """Arm the ``atexit`` removal of this process's containers, then its snapshot images."""
    register_backstop(url)
    remove = functools.partial(remove_own_snapshot_images_sync, url)
    register_removal("images", "snapshot image(s)", str(url), remove)
