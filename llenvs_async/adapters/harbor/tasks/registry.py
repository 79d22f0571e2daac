"""Registry datasets: ``name@version`` resolved through a ``registry.json`` into a local cache.

A ``registry.json`` (Harbor's format) is a list of ``{name, version, description,
tasks: [{name, git_url, git_commit_id, path}]}``. Each task folder is fetched with
``git`` (one bare mirror per repository, a shallow fetch of the pinned commit,
``git archive`` of the folder) into ``<cache>/tasks/<repo-hash>/<commit>/<path>``.
Nothing touches the network when the cache already holds every task.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx

from ....errors import TaskLoadError
from .dataset import HarborDataset, load_tasks

__all__ = [
    "DEFAULT_REGISTRY_URL",
    "RegistryDataset",
    "RegistryTask",
    "TaskCache",
    "find_registry_dataset",
    "parse_registry",
    "split_dataset_spec",
]

DEFAULT_REGISTRY_URL = "https://raw.githubusercontent.com/laude-institute/harbor/main/registry.json"
_GIT_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryTask:
    """One task entry of a registry dataset: where its folder lives in git."""

    name: str
    git_url: str
    git_commit_id: str
    path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryDataset:
    """One ``{name, version, description, tasks}`` entry of a ``registry.json``."""

    name: str
    version: str
    description: str
    tasks: tuple[RegistryTask, ...]


def split_dataset_spec(spec: str) -> tuple[str, str | None]:
    """``"name@version"`` -> ``("name", "version")``; ``"name"`` -> ``("name", None)``."""
    name, sep, version = spec.partition("@")
    if not name or (sep and not version):
        raise ValueError(f"a dataset is 'name@version' or 'name', got {spec!r}")
    return name, version or None


def parse_registry(text: str, *, source: str) -> tuple[RegistryDataset, ...]:
    """Parse and validate a ``registry.json``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskLoadError(f"is not valid JSON: {exc}", path=source) from exc
    if not isinstance(data, list):
        raise TaskLoadError(
            "must be a JSON list of datasets", path=source, value=type(data).__name__
        )
    return tuple(_registry_dataset(entry, i, source) for i, entry in enumerate(data))


def _registry_dataset(entry: object, i: int, source: str) -> RegistryDataset:
    if not isinstance(entry, dict):
        raise TaskLoadError("must be an object", path=source, field=f"[{i}]", value=entry)
    name, version = entry.get("name"), entry.get("version")
    if not isinstance(name, str) or not name:
        raise TaskLoadError(
            "must be a non-empty string", path=source, field=f"[{i}].name", value=name
        )
    if not isinstance(version, str) or not version:
        raise TaskLoadError(
            "must be a non-empty string", path=source, field=f"[{i}].version", value=version
        )
    tasks = entry.get("tasks")
    if not isinstance(tasks, list):
        raise TaskLoadError("must be a list", path=source, field=f"[{i}].tasks", value=tasks)
    return RegistryDataset(
        name=name,
        version=version,
        description=str(entry.get("description") or ""),
        tasks=tuple(_registry_task(t, f"[{i}].tasks[{j}]", source) for j, t in enumerate(tasks)),
    )


def _registry_task(entry: object, where: str, source: str) -> RegistryTask:
    if not isinstance(entry, dict):
        raise TaskLoadError("must be an object", path=source, field=where, value=entry)
    values: dict[str, str] = {}
    for key in ("name", "git_url", "git_commit_id"):
        value = entry.get(key)
        if not isinstance(value, str) or not value:
            raise TaskLoadError(
                "must be a non-empty string", path=source, field=f"{where}.{key}", value=value
            )
        values[key] = value
    path = entry.get("path", "")
    if not isinstance(path, str) or path.startswith("/") or ".." in Path(path).parts:
        raise TaskLoadError(
            "must be a relative path inside the repository",
            path=source,
            field=f"{where}.path",
            value=path,
        )
    return RegistryTask(path=path.strip("/") or ".", **values)


def find_registry_dataset(
    datasets: Sequence[RegistryDataset], name: str, version: str | None, *, source: str
) -> RegistryDataset:
    """The registry entry for ``name@version`` (version optional when only one exists)."""
    candidates = [d for d in datasets if d.name == name]
    if not candidates:
        known = sorted({d.name for d in datasets})
        raise TaskLoadError(f"has no dataset {name!r} (known: {known})", path=source, value=name)
    versions = [d.version for d in candidates]
    if version is None:
        if len(candidates) > 1:
            raise TaskLoadError(
                f"has several versions of {name!r} ({versions}): ask for 'name@version'",
                path=source,
                value=name,
            )
        return candidates[0]
    for dataset in candidates:
        if dataset.version == version:
            return dataset
    raise TaskLoadError(
        f"has no version {version!r} of {name!r} (versions: {versions})",
        path=source,
        value=f"{name}@{version}",
    )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_http(location: str) -> bool:
    return urlparse(location).scheme in ("http", "https")


class TaskCache:
    """Registry reading and git-backed task fetching under one cache directory.

    ``registry`` is a path, a ``file://`` URL or an ``http(s)://`` URL; a fetched
    remote registry is kept in the cache and refreshed only when it lacks the
    requested dataset.
    """

    def __init__(self, cache_dir: Path, registry: str | Path) -> None:
        self.cache_dir = cache_dir
        self.registry = str(registry)
        self._repo_locks: dict[str, asyncio.Lock] = {}

    async def load_dataset(self, spec: str) -> HarborDataset:
        """Resolve ``name@version`` and load its tasks (fetching those not cached yet)."""
        name, version = split_dataset_spec(spec)
        entry = await self._registry_entry(name, version)
        dirs = [await self._task_dir(task) for task in entry.tasks]
        pairs = [(path, task.name) for task, path in zip(entry.tasks, dirs, strict=True)]
        tasks, unloadable = await asyncio.to_thread(load_tasks, pairs)
        return HarborDataset(
            name=entry.name,
            version=entry.version,
            source=self.registry,
            tasks=tasks,
            unloadable=unloadable,
        )

    async def _registry_entry(self, name: str, version: str | None) -> RegistryDataset:
        if not _is_http(self.registry):
            path = Path(
                urlparse(self.registry).path if self.registry.startswith("file:") else self.registry
            )
            text = await asyncio.to_thread(_read_text, path)
            return find_registry_dataset(
                parse_registry(text, source=self.registry), name, version, source=self.registry
            )
        cached = self.cache_dir / "registries" / f"{_digest(self.registry)}.json"
        if cached.is_file():
            datasets = parse_registry(
                await asyncio.to_thread(_read_text, cached), source=str(cached)
            )
            if any(d.name == name and version in (None, d.version) for d in datasets):
                return find_registry_dataset(datasets, name, version, source=str(cached))
        text = await self._download(self.registry)
        datasets = parse_registry(text, source=self.registry)
        await asyncio.to_thread(_write_atomic, cached, text)
        return find_registry_dataset(datasets, name, version, source=self.registry)

    @staticmethod
    async def _download(url: str) -> str:
        try:
            async with httpx.AsyncClient(timeout=60.0, follow_redirects=True) as client:
                response = await client.get(url)
                response.raise_for_status()
        except httpx.HTTPError as exc:
            raise TaskLoadError(f"could not be downloaded: {exc}", path=url) from exc
        return response.text

    async def _task_dir(self, task: RegistryTask) -> Path:
        base = self.cache_dir / "tasks" / _digest(task.git_url) / task.git_commit_id
        target = base / ("_root" if task.path == "." else task.path)
        if target.is_dir():
            return target
        lock = self._repo_locks.setdefault(task.git_url, asyncio.Lock())
        async with lock:
            if not target.is_dir():
                commit = await self._fetch_commit(task)
                mirror = str(self._mirror(task))
                if task.path == "." or await _git_ok(
                    "-C", mirror, "cat-file", "-e", f"{commit}:{task.path}"
                ):
                    archive = await _git(
                        "-C", mirror, "archive", "--format=tar", commit, "--", task.path
                    )
                    await asyncio.to_thread(_extract, archive, task.path, target)
        if not target.is_dir():
            raise TaskLoadError(
                f"has no folder {task.path!r} at commit {task.git_commit_id}",
                path=task.git_url,
                field="path",
                value=task.path,
            )
        return target

    def _mirror(self, task: RegistryTask) -> Path:
        return self.cache_dir / "git" / f"{_digest(task.git_url)}.git"

    async def _fetch_commit(self, task: RegistryTask) -> str:
        """Make the task's commit present in a bare mirror; return the commit's id."""
        mirror = self._mirror(task)
        if not mirror.is_dir():
            mirror.parent.mkdir(parents=True, exist_ok=True)
            await _git("init", "--quiet", "--bare", str(mirror))
        commit = f"{task.git_commit_id}^{{commit}}"
        if await _git_ok("-C", str(mirror), "cat-file", "-e", commit):
            return task.git_commit_id
        await _git(
            "-C", str(mirror), "fetch", "--quiet", "--depth", "1", task.git_url, task.git_commit_id
        )
        out = await _git("-C", str(mirror), "rev-parse", "FETCH_HEAD^{commit}")
        return out.decode().strip()


def _git_env() -> dict[str, str]:
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


async def _git(*args: str) -> bytes:
    """Run ``git`` and return its stdout; failures become ``TaskLoadError``."""
    proc = await asyncio.create_subprocess_exec(
        "git",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        env=_git_env(),
    )
    try:
        async with asyncio.timeout(_GIT_TIMEOUT_S):
            out, err = await proc.communicate()
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        detail = err.decode(errors="replace").strip()
        raise TaskLoadError(f"git {' '.join(args)} failed ({proc.returncode}): {detail}")
    return out


async def _git_ok(*args: str) -> bool:
    """Whether ``git`` succeeds (for existence checks)."""
    try:
        await _git(*args)
    except TaskLoadError:
        return False
    return True


def _extract(archive: bytes, path: str, target: Path) -> None:
    """Unpack a ``git archive`` tar and move its ``path`` folder to ``target`` atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tree = Path(tmp) / "tree"
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        source = tree if path == "." else tree / path
        if source.is_dir() and not target.exists():
            source.rename(target)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskLoadError(f"cannot be read: {exc}", path=str(path)) from exc


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
