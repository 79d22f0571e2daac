"""Task images: each task's ``environment/`` built once, tagged by a hash of its content.

A prebuilt ``[environment].docker_image`` is used when it exists locally (no
registry is ever contacted); otherwise ``environment/Dockerfile`` is built, with
``FROM`` lines rewritten through the adapter's base-image aliases. The tag is
``llenvs-harbor/<task>:<content-hash>``, so an unchanged task is never rebuilt.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
import tarfile
from collections.abc import AsyncIterator, Mapping

from ...docker.engine import DockerEngine
from ...errors import ImageError
from .task import HarborTask

__all__ = ["TASK_IMAGE_LABEL", "TaskImages", "context_tar", "rewrite_from_lines"]

TASK_IMAGE_LABEL = "llenvs.harbor.task"
_FROM_RE = re.compile(
    r"^(\s*FROM\s+(?:--platform=\S+\s+)?)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE
)


def rewrite_from_lines(dockerfile: str, aliases: Mapping[str, str]) -> str:
    """Replace base images named in ``aliases`` on the Dockerfile's ``FROM`` lines."""
    if not aliases:
        return dockerfile
    return _FROM_RE.sub(lambda m: f"{m[1]}{aliases.get(m[2], m[2])}{m[3]}", dockerfile)


def context_tar(task: HarborTask, aliases: Mapping[str, str]) -> tuple[bytes, str]:
    """The build context (``environment/``, Dockerfile rewritten) as tar bytes, and its hash
    over paths, executable bits and contents (never mtimes)."""
    root = task.environment_dir
    digest = hashlib.sha256()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            info = tar.gettarinfo(str(path), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                if rel == "Dockerfile":
                    data = rewrite_from_lines(data.decode("utf-8"), aliases).encode("utf-8")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                digest.update(f"F {rel} {info.mode & 0o111:o} {len(data)}\n".encode())
                digest.update(data)
            else:
                tar.addfile(info)
                digest.update(f"{info.type.decode()} {rel} {info.linkname}\n".encode())
    return buf.getvalue(), digest.hexdigest()[:16]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._") or "task"


class TaskImages:
    """Builds and remembers task images; one build at a time per task (a lock per tag)."""

    def __init__(self, aliases: Mapping[str, str]) -> None:
        self.aliases = dict(aliases)
        self._locks: dict[str, asyncio.Lock] = {}
        self._ready: dict[str, str] = {}
        self.builds = 0

    async def ensure(self, engine: DockerEngine, task: HarborTask) -> str:
        """The local image to run ``task`` in: its prebuilt image, or its built Dockerfile."""
        prebuilt = task.config.environment.docker_image
        if prebuilt is not None:
            ref = self.aliases.get(prebuilt, prebuilt)
            if await engine.inspect_image(ref) is not None:
                return ref
            if task.dockerfile is None:
                raise ImageError(
                    f"task {task.name!r} needs image {prebuilt!r}, which is not present locally "
                    "(no registry is reachable: build or load it, or map it in base_image_aliases)"
                )
        context, content_hash = await asyncio.to_thread(context_tar, task, self.aliases)
        tag = f"llenvs-harbor/{_slug(task.short_name)}:{content_hash}"
        if tag in self._ready:
            return tag
        lock = self._locks.setdefault(tag, asyncio.Lock())
        async with lock:
            if tag not in self._ready:
                if await engine.inspect_image(tag) is None:
                    await self._build(engine, task, context, tag)
                self._ready[tag] = tag
        return tag

    async def _build(
        self, engine: DockerEngine, task: HarborTask, context: bytes, tag: str
    ) -> None:
        timeout = task.config.environment.build_timeout_sec
        params = {
            "t": tag,
            "rm": "1",
            "forcerm": "1",
            "labels": json.dumps({TASK_IMAGE_LABEL: task.name}),
        }
        try:
            async with asyncio.timeout(timeout):
                await engine.post_stream(
                    "build", params=params, body=_chunks(context), action=f"building {tag}"
                )
        except TimeoutError as exc:
            raise ImageError(
                f"building the image of task {task.name!r} took more than "
                f"build_timeout_sec={timeout:g}s"
            ) from exc
        except ImageError as exc:
            raise ImageError(f"task {task.name!r} ({task.dockerfile}): {exc}") from exc
        self.builds += 1


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 1 << 20):
        yield data[start : start + (1 << 20)]
