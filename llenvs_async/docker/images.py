"""Local images without a registry: a Debian base from debootstrap, stand-ins for common
official bases (built from Debian's packages) and a busybox image for tests. How an image is
made through the engine (``build_image``, ``import_rootfs``) is in ``image_build.py``.

Built by ``llenvs-async images build-all`` (or ``build-base``, ``build-standins``,
``build-busybox``), the one entry point the Makefile and the tests' hints use.
"""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import re
import shlex
import shutil
import struct
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ImageError
from .engine import DockerEngine
from .image_build import build_image, bytes_stream, import_rootfs, log_tail

__all__ = [
    "BASE_ALIASES",
    "BASE_IMAGE",
    "BUSYBOX_IMAGE",
    "IMAGE_LABEL",
    "PYTHON_STANDIN",
    "STANDIN_PATTERNS",
    "STANDIN_PYTHON",
    "UV_IMAGE",
    "ImageInfo",
    "apt_mirror",
    "build_image",
    "ensure_base_image",
    "ensure_busybox_image",
    "ensure_standin_images",
    "ensure_uv_standin",
    "import_rootfs",
    "log_tail",
    "tag_slug",
    "uv_wheel_stage",
]

BASE_IMAGE = "llenvs/base:bookworm"
BASE_ALIASES = ("debian:bookworm-slim",)
BUSYBOX_IMAGE = "llenvs/busybox:latest"
IMAGE_LABEL = "llenvs.image"
BASE_PACKAGES = ("python3", "procps", "bash", "coreutils")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PYTHON_STANDIN = "llenvs/python:3-bookworm"
UV_IMAGE = "ghcr.io/astral-sh/uv"
STANDIN_PATTERNS: tuple[tuple[str, str], ...] = (
    ("debian:*", BASE_IMAGE),
    ("ubuntu:*", BASE_IMAGE),
    ("python:3*", PYTHON_STANDIN),
)
"""Official base images (``fnmatch`` patterns on ``repository:tag``) and the local stand-in
each maps to: a Debian bookworm rootfs (plus python3, pip and venv for ``python:3*``)."""
STANDIN_PYTHON: Mapping[str, str] = {BASE_IMAGE: "3.11", PYTHON_STANDIN: "3.11"}
"""The Python each stand-in carries (bookworm's python3), whatever the tag it stands in for
has: ``python:3.12-slim`` and ``ubuntu:24.04`` (3.12 there) get 3.11 here."""
_PYTHON_DOCKERFILE = f"""FROM {BASE_IMAGE}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      python3-pip python3-venv python-is-python3 ca-certificates \\
 && rm -rf /var/lib/apt/lists/* /usr/lib/python3*/EXTERNALLY-MANAGED
LABEL {IMAGE_LABEL}=python-standin
"""
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def tag_slug(name: str) -> str:
    """``name`` as a valid image repository component (lower case, ``[a-z0-9._-]``)."""
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._") or "task"


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageInfo:
    """An image that exists locally; ``built`` is False when an existing one was reused."""

    id: str
    tags: tuple[str, ...]
    built: bool
    seconds: float = 0.0


def apt_mirror(apt_dir: Path = Path("/etc/apt"), suite: str = "bookworm") -> str:
    """The Debian mirror apt already uses for ``suite`` (deb822 ``.sources`` or ``.list`` files)."""
    candidates: list[tuple[str, list[str]]] = []
    for path in sorted(apt_dir.glob("sources.list.d/*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields = dict(
                (key.strip().lower(), value.strip())
                for key, _, value in (line.partition(":") for line in stanza.splitlines())
                if not key.startswith("#") and value
            )
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                suites = fields.get("suites", "").split()
                candidates += [(uri, suites) for uri in fields.get("uris", "").split()]
    for path in [apt_dir / "sources.list", *sorted(apt_dir.glob("sources.list.d/*.list"))]:
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                words = re.sub(r"\[[^]]*\]", "", line).split()
                if len(words) >= 3 and words[0] == "deb":
                    candidates.append((words[1], [words[2]]))
    for uri, suites in candidates:
        if suite in suites and "security" not in uri:
            return uri.rstrip("/")
    return DEFAULT_MIRROR


async def _existing(engine: DockerEngine, tag: str, label: str) -> ImageInfo | None:
    data = await engine.inspect_image(tag)
    if data is None or (data.get("Config") or {}).get("Labels", {}).get(IMAGE_LABEL) != label:
        return None
    return ImageInfo(id=str(data["Id"]), tags=tuple(data.get("RepoTags") or ()), built=False)


class _BuildLock:
    """An exclusive file lock so concurrent processes build an image once."""

    def __init__(self, tag: str) -> None:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)
        self.path = Path(tempfile.gettempdir()) / f"llenvs-image-{name}.lock"
        self._fd = -1

    async def __aenter__(self) -> None:
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o666)
        await asyncio.to_thread(fcntl.flock, self._fd, fcntl.LOCK_EX)

    async def __aexit__(self, *exc_info: object) -> None:
        os.close(self._fd)


async def _run_logged(argv: Sequence[str], log: Path) -> None:
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
        try:
            code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    if code != 0:
        text = await asyncio.to_thread(log.read_text, errors="replace")
        tail = "\n".join(text.splitlines()[-15:])
        raise ImageError(f"{argv[0]} exited with {code} (log {log}):\n{tail}")


async def ensure_base_image(
    engine: DockerEngine,
    *,
    tag: str = BASE_IMAGE,
    aliases: Sequence[str] = BASE_ALIASES,
    suite: str = "bookworm",
    mirror: str | None = None,
    packages: Sequence[str] = BASE_PACKAGES,
    force: bool = False,
) -> ImageInfo:
    """Build the Debian base image from a debootstrap rootfs unless it already exists.

    Needs root and ``debootstrap``; the mirror defaults to the one apt uses here.
    Tags ``aliases`` too, so Dockerfiles saying ``FROM debian:bookworm-slim`` build offline.
    """
    label = f"base-{suite}"
    async with _BuildLock(tag):
        info = None if force else await _existing(engine, tag, label)
        if info is None:
            info = await _build_base(
                engine, tag, suite, mirror or apt_mirror(suite=suite), packages
            )
        for alias in aliases:
            await engine.tag_image(info.id, alias)
    return ImageInfo(id=info.id, tags=(tag, *aliases), built=info.built, seconds=info.seconds)


async def _build_base(
    engine: DockerEngine, tag: str, suite: str, mirror: str, packages: Sequence[str]
) -> ImageInfo:
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImageError("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise ImageError("building the base image needs root (debootstrap creates device files)")
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="llenvs-rootfs-", dir="/var/tmp"))
    try:
        rootfs = workdir / "rootfs"
        argv = [debootstrap, "--variant=minbase", f"--include={','.join(packages)}"]
        await _run_logged([*argv, suite, str(rootfs), mirror], workdir / "debootstrap.log")
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        changes = [
            'CMD ["/bin/bash"]',
            f"ENV PATH={_PATH}",
            f"LABEL {IMAGE_LABEL}=base-{suite}",
        ]
        image_id = await import_rootfs(engine, rootfs, tag, changes=changes)
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, True)
    return ImageInfo(id=image_id, tags=(tag,), built=True, seconds=time.monotonic() - started)


def _is_static_elf(path: Path) -> bool:
    """True when the ELF file has no program interpreter (statically linked)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return False
    endian = "<" if data[5] == 1 else ">"
    (phoff,) = struct.unpack_from(endian + "Q", data, 0x20)
    phentsize, phnum = struct.unpack_from(endian + "HH", data, 0x36)
    types = [struct.unpack_from(endian + "I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    return 3 not in types  # PT_INTERP


def _busybox_tar(busybox: Path, applets: Sequence[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
            member = tarfile.TarInfo(name)
            member.type, member.mode, member.size, member.linkname = kind, mode, len(data), link
            tar.addfile(member, io.BytesIO(data) if data else None)

        for directory, mode in [("bin", 0o755), ("etc", 0o755), ("root", 0o700), ("tmp", 0o1777),
                                ("proc", 0o755), ("sys", 0o755), ("dev", 0o755)]:  # fmt: skip
            add(directory, tarfile.DIRTYPE, mode)
        add("bin/busybox", tarfile.REGTYPE, 0o755, busybox.read_bytes())
        for applet in applets:
            if applet != "busybox" and "/" not in applet:
                add(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox")
        add("etc/passwd", tarfile.REGTYPE, 0o644, b"root:x:0:0:root:/root:/bin/sh\n")
        add("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\n")
    return buf.getvalue()


async def ensure_busybox_image(
    engine: DockerEngine,
    *,
    tag: str = BUSYBOX_IMAGE,
    busybox: Path | None = None,
    force: bool = False,
) -> ImageInfo:
    """Import a tiny image (static busybox + applet links) unless it exists; well under a second."""
    async with _BuildLock(tag):
        info = None if force else await _existing(engine, tag, "busybox")
        if info is not None:
            return info
        found = busybox or Path(shutil.which("busybox") or "/bin/busybox")
        if not found.is_file() or not _is_static_elf(found):
            raise ImageError(
                f"no statically linked busybox at {found} (apt-get install busybox-static)"
            )
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            str(found), "--list", stdout=asyncio.subprocess.PIPE
        )
        listing, _ = await proc.communicate()
        tar = _busybox_tar(found, listing.decode().split())
        changes = ['CMD ["/bin/sh"]', f"ENV PATH={_PATH}", f"LABEL {IMAGE_LABEL}=busybox"]
        image_id = await import_rootfs(engine, tar, tag, changes=changes)
    return ImageInfo(id=image_id, tags=(tag,), built=True, seconds=time.monotonic() - started)


async def ensure_standin_images(engine: DockerEngine, *, force: bool = False) -> list[ImageInfo]:
    """The base image, then the python stand-in (``apt-get`` from the host's network, once)."""
    base = await ensure_base_image(engine, force=False)
    info = await _ensure_built(engine, PYTHON_STANDIN, "python-standin", _PYTHON_DOCKERFILE, force)
    return [base, info]


def uv_wheel_stage(
    version: str, *, name: str, base: str = PYTHON_STANDIN, index_url: str | None = None
) -> str:
    """A Dockerfile stage ``name`` (on ``base``, a Python with pip) holding uv ``version``'s
    ``/uv`` and ``/uvx`` as ``ghcr.io/astral-sh/uv`` does, from the uv wheel on the package
    index (``index_url``: another one) instead of a registry."""
    index = f"--index-url {shlex.quote(index_url)} " if index_url else ""
    return (
        f"FROM {base} AS {name}\n"
        f"RUN echo 'llenvs-async: uv {version} from its wheel (a stand-in for "
        f"ghcr.io/astral-sh/uv:{version})' && python3 -m pip download {index}--no-deps "
        f"--only-binary=:all: -d /llenvs-w uv=={version} && python3 -m zipfile -e "
        "/llenvs-w/uv-*.whl /llenvs-x && cp /llenvs-x/uv-*.data/scripts/uv "
        "/llenvs-x/uv-*.data/scripts/uvx / && chmod 755 /uv /uvx && rm -rf /llenvs-w /llenvs-x"
    )


async def ensure_uv_standin(
    engine: DockerEngine, version: str, *, index_url: str | None = None, force: bool = False
) -> ImageInfo:
    """``ghcr.io/astral-sh/uv:<version>`` as a local image (``/uv``, ``/uvx``) built from the
    uv wheel (the host's network, once; needs the python stand-in)."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ValueError(f"a uv version is X.Y.Z, got {version!r}")
    stage = uv_wheel_stage(version, name="wheel", index_url=index_url)
    text = f"{stage}\nFROM scratch\nCOPY --from=wheel /uv /uvx /\nLABEL {IMAGE_LABEL}=uv-standin\n"
    return await _ensure_built(engine, f"{UV_IMAGE}:{version}", "uv-standin", text, force)


async def _ensure_built(
    engine: DockerEngine, tag: str, label: str, dockerfile: str, force: bool
) -> ImageInfo:
    """``tag`` built from ``dockerfile`` with the host's network unless an image of ours
    (``label``) has it already."""
    async with _BuildLock(tag):
        info = None if force else await _existing(engine, tag, label)
        if info is not None:
            return info
        started = time.monotonic()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            text = dockerfile.encode()
            member = tarfile.TarInfo("Dockerfile")
            member.size = len(text)
            tar.addfile(member, io.BytesIO(text))
        await build_image(engine, bytes_stream(buf.getvalue()), tag=tag, network=True)
        data = await engine.inspect_image(tag)
        assert data is not None
        return ImageInfo(
            id=str(data["Id"]), tags=(tag,), built=True, seconds=time.monotonic() - started
        )
