"""Making an image through the engine: ``build_image`` (``docker build`` of a tar context,
its failure shown as the failing step plus the build log's tail) and ``import_rootfs``
(``docker import`` of a rootfs directory or tar bytes).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from ..errors import ImageError
from .engine import DockerEngine, split_image_ref

__all__ = ["build_image", "bytes_stream", "import_rootfs", "log_tail"]

_LOG_TAIL_LINES = 12
_LINE_CHARS = 160
_ERROR_CHARS = 400
_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_PROGRESS_RE = re.compile(r"^[\s\u2500-\u259f|#=>.-]*\d[\d.]*\s*/\s*\d[\d.]*\s*[kMG]?B")


async def _tar_stream(rootfs: Path) -> AsyncIterator[bytes]:
    proc = await asyncio.create_subprocess_exec(
        "tar", "--numeric-owner", "-C", str(rootfs), "-c", ".",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        while chunk := await proc.stdout.read(1 << 20):
            yield chunk
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    if proc.returncode != 0:
        raise ImageError(f"tar of {rootfs} exited with {proc.returncode}")


async def bytes_stream(data: bytes) -> AsyncIterator[bytes]:
    """``data`` as a request body: an async stream of 1 MiB chunks."""
    for start in range(0, len(data), 1 << 20):
        yield data[start : start + (1 << 20)]


async def import_rootfs(
    engine: DockerEngine,
    rootfs: Path | bytes,
    repo_tag: str,
    *,
    changes: Sequence[str] = (),
) -> str:
    """``docker import``: make an image from a rootfs directory or tar bytes; return its id.

    Uses ``POST /images/create?fromSrc=-`` (aiodocker's ``import_image`` is ``docker load``).
    """
    repo, tag = split_image_ref(repo_tag)
    body = bytes_stream(rootfs) if isinstance(rootfs, bytes) else _tar_stream(rootfs)
    params = {"fromSrc": "-", "repo": repo, "tag": tag}
    if changes:
        params["changes"] = "\n".join(changes)
    messages = await engine.post_stream(
        "images/create", params=params, body=body, action=f"importing {repo_tag}"
    )
    statuses = [str(m["status"]) for m in messages if "status" in m]
    image_id = statuses[-1] if statuses else ""
    if not image_id.startswith("sha256:"):
        data = await engine.inspect_image(repo_tag)
        if data is None:
            raise ImageError(f"importing {repo_tag} produced no image (engine said {messages!r})")
        image_id = str(data["Id"])
    return image_id


async def build_image(
    engine: DockerEngine,
    context: AsyncIterable[bytes],
    *,
    tag: str,
    labels: Mapping[str, str] | None = None,
    network: bool = False,
    what: str | None = None,
    dockerfile: str = "Dockerfile",
    diagnose: Callable[[Sequence[str]], str | None] | None = None,
) -> list[str]:
    """``docker build`` of a tar context; returns the build log's lines.

    ``network``: build with the host's network (the daemon here has no bridge, so that is
    the only network a build can get); else none. A failed build raises ``ImageError`` with
    the failing step's error AND the last lines of the build log, short enough for one
    screen (ANSI escapes and progress bars dropped, long lines cut); ``diagnose`` sees the
    whole log and may add a hint line.
    """
    what = what or f"building {tag}"
    params = {"t": tag, "rm": "1", "forcerm": "1", "networkmode": "host" if network else "none"}
    if dockerfile != "Dockerfile":
        params["dockerfile"] = dockerfile
    if labels:
        params["labels"] = json.dumps(dict(labels))
    log: list[str] = []
    errors: list[str] = []

    def on_line(line: str) -> None:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            log.append(line)
            return
        if "stream" in message:
            log.extend(str(message["stream"]).rstrip("\n").splitlines())
        if "error" in message or "errorDetail" in message:
            detail = message.get("errorDetail", {}).get("message") or message.get("error")
            errors.append(str(detail))

    await engine.post_lines("build", params=params, body=context, on_line=on_line, action=what,
                            image=tag)  # fmt: skip
    error = errors[-1] if errors else None
    if error is not None:
        hint = diagnose(log) if diagnose is not None else None
        message = f"{what} failed: {_clip(error, _ERROR_CHARS)}\n{log_tail(log)}"
        raise ImageError(message if hint is None else f"{message}\n{hint}")
    return log


def _clip(text: str, limit: int) -> str:
    """``text`` without ANSI escapes, at most ``limit`` characters (its middle cut)."""
    clean = _ANSI_RE.sub("", text).replace("\r", "").strip()
    if len(clean) <= limit:
        return clean
    half = (limit - 5) // 2
    return f"{clean[:half]} ... {clean[-half:]}"


def log_tail(lines: Sequence[str], count: int = _LOG_TAIL_LINES) -> str:
    """The last ``count`` meaningful lines of a build log, one screen at most."""
    kept = [_clip(line, _LINE_CHARS) for line in lines]
    kept = [line for line in kept if line and not _PROGRESS_RE.match(line)]
    body = "\n".join(f"  | {line}" for line in kept[-count:])
    return f"build log (last lines):\n{body}"
