"""``HarborAdapter``: resolves datasets once and makes cheap ``HarborEnvironment`` instances.

Datasets (task catalogues) and task images are cached on the adapter, so an
``env_factory`` that calls ``get_environment`` per rollout costs no I/O until the
instance's ``reset`` starts its container.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Literal

from ..._resource import AsyncResource
from ...docker.engine import DockerEngine
from ...docker.pool import WarmPool
from ...docker.runtime import get_runtime
from .episode.environment import HarborEnvironment, HarborRuntime
from .images.image import BuildSettings, TaskImages
from .settings import HarborSettings
from .tasks.dataset import HarborDataset, load_local_dataset
from .tasks.registry import DEFAULT_REGISTRY_URL, TaskCache

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


class HarborAdapter(AsyncResource):
    """Harbor datasets as environments.

    ``registry``: path or URL of a ``registry.json`` for ``name@version`` datasets
    (default ``$LLENVS_HARBOR_REGISTRY`` or Harbor's public registry). How tasks are built
    and run is one ``HarborSettings`` value: ``settings=``, or its fields as keywords
    (``HarborAdapter(allow_network=True, runtime="gvisor")``), validated there. Containers get
    a network only when a task asks for one AND ``allow_network`` is true. ``engine``: the
    ``DockerEngine`` every environment uses (owned by the caller); by default the adapter opens
    one on first use (one client for all its instances). ``runtime="gvisor"``: episodes run in
    gVisor sandboxes (``llenvs_async.sandbox``; needs runsc, root, no network), which
    ``SnapshotRestore(processes=True)`` can fork with their processes. Close the adapter
    (``async with``) to remove the warm pool's containers and close its engine.
    """

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        registry: str | Path | None = None,
        *,
        settings: HarborSettings | None = None,
        docker_url: str | None = None,
        engine: DockerEngine | None = None,
        **options: Any,
    ) -> None:
        if settings is not None and options:
            raise TypeError(
                f"give settings= or its fields as keywords, not both (got {sorted(options)})"
            )
        self.settings = settings = settings or HarborSettings(**options)
        get_runtime(settings.runtime).check()  # now, naming what is missing (GvisorUnavailable)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.registry = str(
            registry or os.environ.get("LLENVS_HARBOR_REGISTRY") or DEFAULT_REGISTRY_URL
        )
        ca_bundle = settings.build_ca_bundle
        self.images = TaskImages(
            settings.base_image_aliases,
            BuildSettings(
                network=settings.build_network,
                ca_bundle=None if ca_bundle is None else Path(ca_bundle),
                provision_verifier=settings.provision_verifier,
                provision_index_url=settings.provision_index_url,
            ),
        )
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else DockerEngine(docker_url)
        self.pool = WarmPool(self.engine, settings.warm_pool) if settings.warm_pool else None
        artifacts = settings.artifacts_dir
        self.runtime = HarborRuntime(
            images=self.images,
            allow_network=settings.allow_network,
            docker_url=docker_url,
            engine=self.engine,
            pool=self.pool,
            artifacts_dir=None if artifacts is None else Path(artifacts),
            engine_users=set() if self._owns_engine and self.pool is None else None,
            container_runtime=settings.runtime,
        )
        self._closed = False
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
        command_timeout_sec: float | Literal["task"] | None = None,
        verify_on_truncation: bool = True,
        budget_sec: float | Literal["task"] | None = "task",
    ) -> HarborEnvironment:
        """A new, not yet reset ``HarborEnvironment`` speaking the adapter's action format;
        ``budget_sec="task"`` takes the budget from ``[agent].timeout_sec`` (``None``:
        unlimited), ``command_timeout_sec="task"`` each command's limit too (180 s when the
        task gives none); by default the settings' ``command_timeout_sec`` (180 s, within the
        budget)."""
        dataset = await self.get_dataset(name_or_path)
        settings = self.settings
        return HarborEnvironment(
            self.runtime,
            dataset,
            max_steps=max_steps,
            submit_keyword=submit_keyword,
            command_timeout_sec=(
                settings.command_timeout_sec if command_timeout_sec is None else command_timeout_sec
            ),
            verify_on_truncation=verify_on_truncation,
            budget_sec=budget_sec,
            action_format=settings.action_format,
            max_format_errors=settings.max_format_errors,
            max_observation_chars=settings.max_observation_chars,
            system_prompt=settings.system_prompt,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Remove the warm pool's containers and close the adapter's engine (idempotent);
        environments made by it close their own containers."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.pool is not None:
                await self.pool.aclose()
        finally:
            if self._owns_engine:
                await self.engine.aclose()
