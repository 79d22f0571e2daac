"""``HarborAdapter``: resolves datasets once and makes cheap ``HarborEnvironment`` instances.

Datasets (task catalogues) and task images are cached on the adapter, so an
``env_factory`` that calls ``get_environment`` per rollout costs no I/O until the
instance's ``reset`` starts its container.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from ...docker.engine import DockerEngine
from .dataset import HarborDataset, load_local_dataset
from .environment import HarborEnvironment, HarborRuntime
from .image import BuildSettings, TaskImages
from .registry import DEFAULT_REGISTRY_URL, TaskCache

__all__ = ["HarborAdapter", "default_cache_dir"]


def default_cache_dir() -> Path:
    """``$LLENVS_HARBOR_CACHE``, else ``$XDG_CACHE_HOME/llenvs-async/harbor`` (``~/.cache``)."""
    if explicit := os.environ.get("LLENVS_HARBOR_CACHE"):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "llenvs-async" / "harbor"


def _dataset_key(name_or_path: str | Path) -> tuple[str, bool]:
    """``(key, is_local)``: a resolved directory path, or a ``name@version`` spec as given."""
    local = isinstance(name_or_path, Path) or (
        name_or_path.startswith((".", "/", "~"))
        or os.sep in name_or_path
        or Path(name_or_path).expanduser().exists()
    )
    if local:
        return str(Path(name_or_path).expanduser().resolve()), True
    return str(name_or_path), False


class HarborAdapter:
    """Harbor datasets as environments.

    ``registry``: path or URL of a ``registry.json`` for ``name@version`` datasets
    (default ``$LLENVS_HARBOR_REGISTRY`` or Harbor's public registry). Containers get
    a network only when a task asks for one AND ``allow_network`` is true.
    ``base_image_aliases`` maps image names (``fnmatch`` patterns, e.g. ``"python:3.*"``)
    that Dockerfiles (``FROM``, ``COPY --from``) and prebuilt ``docker_image`` names use
    to images present locally; unmapped names fall back to built-in stand-ins (see
    ``image.py``). ``build_network``: builds use the host's network (off by default,
    separate from ``allow_network``); ``build_ca_bundle``: a host CA file trusted inside
    builds. ``engine``: share one ``DockerEngine`` (owned by the caller); by default each
    environment opens its own.
    """

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        registry: str | Path | None = None,
        *,
        allow_network: bool = False,
        base_image_aliases: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
        build_network: bool = False,
        build_ca_bundle: str | Path | None = None,
        docker_url: str | None = None,
        engine: DockerEngine | None = None,
    ) -> None:
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.registry = str(
            registry or os.environ.get("LLENVS_HARBOR_REGISTRY") or DEFAULT_REGISTRY_URL
        )
        self.allow_network = allow_network
        ca_bundle = Path(build_ca_bundle).expanduser() if build_ca_bundle else None
        if ca_bundle is not None and not ca_bundle.is_file():
            raise ValueError(f"build_ca_bundle {str(ca_bundle)!r} is not a file")
        self.images = TaskImages(
            base_image_aliases or (),
            BuildSettings(network=build_network, ca_bundle=ca_bundle),
        )
        self.runtime = HarborRuntime(
            images=self.images, allow_network=allow_network, docker_url=docker_url, engine=engine
        )
        self._cache = TaskCache(self.cache_dir, self.registry)
        self._datasets: dict[str, HarborDataset] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get_dataset(self, name_or_path: str | Path) -> HarborDataset:
        """A local task directory (sorted by name) or ``name@version`` from the registry,
        loaded once per adapter."""
        key, local = _dataset_key(name_or_path)
        if key in self._datasets:
            return self._datasets[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key not in self._datasets:
                if local:
                    dataset = await asyncio.to_thread(load_local_dataset, key)
                else:
                    dataset = await self._cache.load_dataset(key)
                self._datasets[key] = dataset
        return self._datasets[key]

    async def list_tasks(self, name_or_path: str | Path) -> list[tuple[int, str]]:
        """``(index, name)`` of every task of a dataset, in its stable order."""
        return (await self.get_dataset(name_or_path)).list_tasks()

    async def get_environment(
        self,
        name_or_path: str | Path,
        max_steps: int | None = 30,
        *,
        submit_keyword: str = "SUBMIT",
        command_timeout_sec: float | Literal["task"] = "task",
        verify_on_truncation: bool = True,
        budget_sec: float | Literal["task"] | None = "task",
    ) -> HarborEnvironment:
        """A new, not yet reset ``HarborEnvironment``; ``budget_sec="task"`` takes the budget
        from ``[agent].timeout_sec`` (``None``: unlimited), ``command_timeout_sec="task"`` each
        command's limit too (600 s when the task gives none)."""
        dataset = await self.get_dataset(name_or_path)
        return HarborEnvironment(
            self.runtime,
            dataset,
            max_steps=max_steps,
            submit_keyword=submit_keyword,
            command_timeout_sec=command_timeout_sec,
            verify_on_truncation=verify_on_truncation,
            budget_sec=budget_sec,
        )
