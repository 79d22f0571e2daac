"""OCI bundles for gVisor sandboxes: a task image's root filesystem (exported once per image
id and cached), and a ``config.json`` with our safe defaults and ownership annotations.

The exported rootfs is shared read-only by every sandbox of that image: sandboxes run
with ``--overlay2=root:memory``, so their writes stay in sandbox memory (and travel with
a checkpoint) and never reach the shared directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._shield import shielded
from ..docker.container import ContainerSpec
from ..docker.engine import DockerEngine
from ..errors import GvisorUnavailableError, ImageError

__all__ = [
    "INIT_PATH",
    "ImageRootfs",
    "ensure_rootfs",
    "find_init",
    "oci_config",
    "rootfs_cache_dir",
    "write_bundle",
]

INIT_PATH = "/.llenvs-init"
"""Where the sandbox sees its init (tini, bind-mounted read-only), which reaps zombies."""
_INITS = ("docker-init", "tini-static", "tini")
# Docker's default capabilities; ``ContainerSpec.cap_drop`` removes some, as for containers.
_DOCKER_CAPS = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                "NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                "SYS_CHROOT")  # fmt: skip
# The pids cgroup of a sandbox counts host tasks: the sentry's threads and, on ptrace, a stub
# per guest thread (about 7 host tasks per guest process measured here), plus a base.
HOST_TASKS_PER_PID = 8
HOST_TASKS_BASE = 256
_DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_locks: dict[str, asyncio.Lock] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageRootfs:
    """An image exported for sandboxes: its root directory and what its config says."""

    image_id: str
    path: Path
    env: tuple[str, ...]
    workdir: str
    user: str


def rootfs_cache_dir() -> Path:
    """``$LLENVS_GVISOR_CACHE``, else ``$XDG_CACHE_HOME/llenvs-async/gvisor`` (``~/.cache``)."""
    if explicit := os.environ.get("LLENVS_GVISOR_CACHE"):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "llenvs-async" / "gvisor"


def find_init() -> str:
    """tini on the host (Debian's docker.io ships it as ``docker-init``)."""
    for name in _INITS:
        if found := shutil.which(name):
            return os.path.realpath(found)
    raise GvisorUnavailableError(
        f"no init for sandboxes: none of {', '.join(_INITS)} is on PATH (install docker.io or tini)"
    )


async def ensure_rootfs(engine: DockerEngine, image: str) -> ImageRootfs:
    """The image's root filesystem, exported (``docker export`` of a created, never started
    container) into the cache on first use; later calls for the same image id are free."""
    info = await engine.inspect_image(image)
    if info is None:
        raise ImageError(f"image {image!r} is not present locally (sandboxes never pull)")
    image_id = str(info["Id"])
    config = info.get("Config") or {}
    target = rootfs_cache_dir() / "rootfs" / image_id.removeprefix("sha256:")[:24]
    async with _locks.setdefault(image_id, asyncio.Lock()):
        if not (target / ".llenvs-complete").exists():
            await _export(engine, image, target)
    return ImageRootfs(
        image_id=image_id,
        path=target,
        env=tuple(config.get("Env") or ()),
        workdir=str(config.get("WorkingDir") or "/"),
        user=str(config.get("User") or ""),
    )


async def _export(engine: DockerEngine, image: str, target: Path) -> None:
    """Export ``image`` into ``target`` (extracted next to it, then renamed into place); on
    error or cancellation ``tar``, the partial tree and the export container all go."""
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    await asyncio.to_thread(_empty_dir, partial)
    body: dict[str, Any] = {"Image": image, "Entrypoint": ["/"], "Cmd": [], "Labels": engine.labels,
            "NetworkDisabled": True}  # fmt: skip
    created = await engine.create_container(
        body, action=f"creating a container to export {image!r}", image=image
    )
    tar: asyncio.subprocess.Process | None = None
    try:
        tar = await asyncio.create_subprocess_exec(
            "tar", "-C", str(partial), "-x", "--numeric-owner", "-f", "-",
            stdin=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        stdin = tar.stdin
        assert stdin is not None

        async def write(chunk: bytes) -> None:
            stdin.write(chunk)
            await stdin.drain()

        await engine.export_container(created, write)
        stdin.close()
        _, err = await tar.communicate()
        if tar.returncode != 0:
            raise ImageError(f"extracting {image!r} for gVisor failed: {err.decode()[-300:]}")
        await asyncio.to_thread(_move_into_place, partial, target)
    finally:
        try:
            if tar is not None and tar.returncode is None:
                tar.kill()
                await shielded(tar.wait(), within=10)
            await shielded(asyncio.to_thread(shutil.rmtree, partial, ignore_errors=True),
                           within=120)  # fmt: skip
        finally:
            await shielded(engine.remove_container(created), within=30)


def _empty_dir(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)


def _move_into_place(partial: Path, target: Path) -> None:
    """Mark ``partial`` complete and replace ``target`` with it."""
    (partial / ".llenvs-complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _user_ids(rootfs: Path, user: str) -> tuple[int, int]:
    """``uid[:gid]`` or a name looked up in the rootfs's ``/etc/passwd``."""
    name, _, group = user.partition(":")
    if not name:
        return 0, 0
    if name.isdigit():
        return int(name), int(group) if group.isdigit() else int(name)
    try:
        lines = (rootfs / "etc" / "passwd").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split(":")
        if len(fields) > 3 and fields[0] == name:
            return int(fields[2]), int(group) if group.isdigit() else int(fields[3])
    raise ImageError(f"user {user!r} is not in the image's /etc/passwd")


def oci_config(
    spec: ContainerSpec,
    rootfs: ImageRootfs,
    *,
    init: str,
    annotations: Mapping[str, str],
) -> dict[str, Any]:
    """The bundle's ``config.json``: ``spec.command`` under tini, the image's env and workdir
    under the spec's, Docker's capabilities less ``cap_drop``, pids/memory/cpu limits (the
    pids limit scaled to host tasks: ``HOST_TASKS_PER_PID``; memory includes the sentry's)."""
    caps = sorted((set(_DOCKER_CAPS) - set(spec.cap_drop)) | set(spec.cap_add))
    caps = [f"CAP_{cap}" for cap in caps]
    env = dict(item.partition("=")[::2] for item in (_DEFAULT_PATH, *rootfs.env))
    env.update(spec.env)
    uid, gid = _user_ids(rootfs.path, spec.user or rootfs.user)
    resources: dict[str, Any] = {}
    if spec.pids_limit is not None:
        limit = spec.pids_limit * HOST_TASKS_PER_PID + HOST_TASKS_BASE
        resources["pids"] = {"limit": limit}
    if spec.memory_bytes is not None:
        resources["memory"] = {"limit": spec.memory_bytes, "swap": spec.memory_bytes}
    if spec.cpus is not None:
        resources["cpu"] = {"quota": int(spec.cpus * 100_000), "period": 100_000}
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": [INIT_PATH, "-s", "--", *spec.command],
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": spec.workdir or rootfs.workdir or "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576},
                *(
                    [{"type": "RLIMIT_FSIZE", "hard": size, "soft": size}]
                    if (size := spec.max_file_bytes) is not None
                    else []
                ),
            ],
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs.path), "readonly": False},
        "hostname": spec.hostname or "sandbox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            },
            {"destination": INIT_PATH, "type": "bind", "source": init, "options": ["rbind", "ro"]},
        ],
        "annotations": dict(annotations),
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "resources": resources,
        },
    }


def write_bundle(directory: Path, config: Mapping[str, Any]) -> None:
    """Write ``config.json`` into a new bundle directory."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    (directory / "config.json").write_text(json.dumps(config))
