"""Task Dockerfiles: the external images they name, those lines rewritten to local images
(plus a trusted CA bundle per stage), and the build context as a content-hashed tar."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..tasks.task import HarborTask
from .image_names import alias_matches

__all__ = [
    "CA_BUNDLE_PATH",
    "ImageUse",
    "context_tar",
    "image_uses",
    "rewrite_from_lines",
    "rewrite_images",
]

CA_BUNDLE_PATH = "/usr/local/share/ca-certificates/llenvs-build-ca.crt"
_CA_CONTEXT_NAME = ".llenvs-build-ca.crt"
_FROM_RE = re.compile(
    r"^(\s*FROM\s+(?:--platform=\S+\s+)?)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE
)
_ARG_RE = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*$", re.IGNORECASE)
_STAGE_RE = re.compile(r"\s+AS\s+(\S+)\s*$", re.IGNORECASE)
_COPY_FROM_RE = re.compile(r"^(\s*(?:COPY|ADD)\s+(?:--\S+\s+)*?--from=)(\S+)", re.IGNORECASE)
_VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageUse:
    """One image a Dockerfile names, where, and what it resolved to."""

    written: str
    line: int
    image: str
    kind: str


def rewrite_from_lines(dockerfile: str, aliases: Mapping[str, str]) -> str:
    """Replace base images matched by ``aliases`` (exact names or patterns) on ``FROM`` lines."""
    if not aliases:
        return dockerfile

    def sub(match: re.Match[str]) -> str:
        image = next((v for k, v in aliases.items() if alias_matches(k, match[2])), match[2])
        return f"{match[1]}{image}{match[3]}"

    return _FROM_RE.sub(sub, dockerfile)


def _expand(text: str, args: Mapping[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match[1] or match[3]
        value = args.get(name, "")
        return value or (match[2] or "")

    return _VAR_RE.sub(sub, text)


def image_uses(dockerfile: str) -> list[tuple[int, str, str]]:
    """``(line index, kind, image as written after ARG expansion)`` for every external image
    (``FROM``/``COPY --from``; stage names, stage indices and ``scratch`` excluded)."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    uses: list[tuple[int, str, str]] = []
    seen_from = False
    for index, line in enumerate(dockerfile.split("\n")):
        if (arg := _ARG_RE.match(line)) and not seen_from:
            args[arg[1]] = arg[2] or ""
        elif from_match := _FROM_RE.match(line):
            seen_from = True
            image = _expand(from_match[2], args)
            if image.lower() not in stages and image.lower() != "scratch":
                uses.append((index, "FROM", image))
            if stage := _STAGE_RE.search(from_match[3]):
                stages.add(stage[1].lower())
        elif copy := _COPY_FROM_RE.match(line):
            source = _expand(copy[2], args)
            if source.lower() not in stages and not source.isdigit():
                uses.append((index, "COPY --from", source))
    return uses


def rewrite_images(dockerfile: str, uses: Sequence[ImageUse], ca_bundle: bool) -> str:
    """``dockerfile`` with each use's line naming its resolved image; ``ca_bundle``: every
    stage copies the build CA bundle in and points the usual variables at it."""
    lines = dockerfile.split("\n")
    by_line = {use.line: use for use in uses}
    out: list[str] = []
    for index, line in enumerate(lines):
        use = by_line.get(index)
        if use is not None:
            if from_match := _FROM_RE.match(line):
                line = f"{from_match[1]}{use.image}{from_match[3]}"
            elif copy := _COPY_FROM_RE.match(line):
                line = f"{copy[1]}{use.image}{line[copy.end() :]}"
        out.append(line)
        if ca_bundle and _FROM_RE.match(line):
            out.append(f"COPY {_CA_CONTEXT_NAME} {CA_BUNDLE_PATH}")
            variables = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
            out.append("ENV " + " ".join(f"{var}={CA_BUNDLE_PATH}" for var in variables))
    return "\n".join(out)


def context_tar(
    task: HarborTask,
    dockerfile: str | Mapping[str, str],
    ca_bundle: Path | None = None,
    *,
    root: Path | None = None,
    dockerfile_name: str = "Dockerfile",
) -> tuple[bytes, str]:
    """The build context (``root``, default ``environment/``, with ``dockerfile`` as its
    ``dockerfile_name``, or the task's own rewritten through an alias mapping) as tar bytes,
    and its hash over paths, executable bits and contents (never mtimes)."""
    if not isinstance(dockerfile, str):
        assert task.dockerfile is not None
        dockerfile = rewrite_from_lines(task.dockerfile.read_text(encoding="utf-8"), dockerfile)
    root = root or task.environment_dir
    digest = hashlib.sha256()
    buf = io.BytesIO()

    def add_file(rel: str, data: bytes, info: tarfile.TarInfo) -> None:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        digest.update(f"F {rel} {info.mode & 0o111:o} {len(data)}\n".encode())
        digest.update(data)

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            info = tar.gettarinfo(str(path), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_file() and not path.is_symlink():
                data = dockerfile.encode("utf-8") if rel == dockerfile_name else path.read_bytes()
                add_file(rel, data, info)
            else:
                tar.addfile(info)
                digest.update(f"{info.type.decode()} {rel} {info.linkname}\n".encode())
        if ca_bundle is not None:
            add_file(_CA_CONTEXT_NAME, ca_bundle.read_bytes(), tarfile.TarInfo(_CA_CONTEXT_NAME))
    return buf.getvalue(), digest.hexdigest()[:16]
