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

from ..._resource import AsyncResource
from ...docker.engine import DockerEngine
from ...docker.pool import WarmPool
from ...docker.runtime import get_runtime
from ...docker.shell_task import DEFAULT_MAX_OBSERVATION_CHARS
from ...protocols import AgentProtocol, get_protocol
from .dataset import HarborDataset, load_local_dataset
from .environment import DEFAULT_COMMAND_TIMEOUT_SEC, HarborEnvironment, HarborRuntime
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


class HarborAdapter(AsyncResource):
    """Harbor datasets as environments.

    ``registry``: path or URL of a ``registry.json`` for ``name@version`` datasets
    (default ``$LLENVS_HARBOR_REGISTRY`` or Harbor's public registry). Containers get
    a network only when a task asks for one AND ``allow_network`` is true.
    ``base_image_aliases`` maps image names (``fnmatch`` patterns, e.g. ``"python:3.*"``)
    that Dockerfiles (``FROM``, ``COPY --from``) and prebuilt ``docker_image`` names use
    to images present locally; unmapped names fall back to built-in stand-ins (see
    ``image_names.py``). ``build_network``: builds use the host's network (off by default,
    separate from ``allow_network``); ``build_ca_bundle``: a host CA file trusted inside
    builds. ``engine``: the ``DockerEngine`` every environment uses (owned by the caller);
    by default the adapter opens one on first use (one client for all its instances).
    ``warm_pool``: keep up to N started containers (shell open) per task image, so a
    ``reset`` takes one instead of creating it. ``artifacts_dir``: keep each verified
    episode's ``artifacts`` (and ``/logs/artifacts``) under ``<dir>/<task>/<episode id>/``.
    ``provision_verifier``: a ``test.sh`` of the common ``curl .../uv/<ver>/install.sh | sh;
    uvx --with ... pytest`` shape gets uv and its packages at build time and runs offline
    (see ``provision.py``; needs ``build_network``); ``provision_index_url``: the package
    index (PEP 503 ``/simple`` URL) it downloads from instead of pip's/uv's default.
    ``runtime="gvisor"``: episodes run in gVisor sandboxes (``llenvs_async.sandbox``; needs
    runsc, root, no network), which ``SnapshotRestore(processes=True)`` can fork with their
    processes. ``action_format`` (``"text"``, ``"tools"`` or an ``AgentProtocol``),
    ``max_format_errors``, ``max_observation_chars`` and ``system_prompt`` are every
    environment's (see ``ShellTaskEnvironment``). Close the adapter (``async with``) to
    remove the pool's containers and close
    its engine.
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
        warm_pool: int = 0,
        artifacts_dir: str | Path | None = None,
        provision_verifier: bool = False,
        provision_index_url: str | None = None,
        runtime: Literal["runc", "gvisor"] = "runc",
        action_format: str | AgentProtocol = "text",
        max_format_errors: int | None = 3,
        max_observation_chars: int | None = DEFAULT_MAX_OBSERVATION_CHARS,
        system_prompt: str | None = None,
    ) -> None:
        if provision_verifier and not build_network:
            raise ValueError(
                "provision_verifier=True fetches the verifier's uv/pytest at build time: "
                "it needs build_network=True (--build-network)"
            )
        if provision_index_url is not None and not provision_verifier:
            raise ValueError("provision_index_url is the index of provision_verifier=True")
        box_runtime = get_runtime(runtime)  # an unknown name: ValueError naming the known
        if warm_pool and "warm_pool" not in box_runtime.capabilities:
            raise ValueError(
                f"warm_pool holds Docker containers, not boxes of runtime {runtime!r}: "
                f"use warm_pool=0 with runtime={runtime!r}"
            )
        box_runtime.check()  # now, naming what is missing (GvisorUnavailableError)
        if isinstance(warm_pool, bool) or not isinstance(warm_pool, int) or warm_pool < 0:
            raise ValueError(f"warm_pool must be an int >= 0, got {warm_pool!r}")
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
            BuildSettings(
                network=build_network,
                ca_bundle=ca_bundle,
                provision_verifier=provision_verifier,
                provision_index_url=provision_index_url,
            ),
        )
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else DockerEngine(docker_url)
        self.pool = WarmPool(self.engine, warm_pool) if warm_pool else None
        self.runtime = HarborRuntime(
            images=self.images,
            allow_network=allow_network,
            docker_url=docker_url,
            engine=self.engine,
            pool=self.pool,
            artifacts_dir=Path(artifacts_dir).expanduser() if artifacts_dir else None,
            engine_users=set() if self._owns_engine and self.pool is None else None,
            container_runtime=runtime,
        )
        get_protocol(action_format)  # an unknown name fails here, not at the first reset
        self.action_format = action_format
        self.max_format_errors = max_format_errors
        self.max_observation_chars = max_observation_chars
        self.system_prompt = system_prompt
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
        command_timeout_sec: float | Literal["task"] = DEFAULT_COMMAND_TIMEOUT_SEC,
        verify_on_truncation: bool = True,
        budget_sec: float | Literal["task"] | None = "task",
    ) -> HarborEnvironment:
        """A new, not yet reset ``HarborEnvironment`` speaking the adapter's action format;
        ``budget_sec="task"`` takes the budget from ``[agent].timeout_sec`` (``None``:
        unlimited), ``command_timeout_sec="task"`` each command's limit too (180 s when the
        task gives none; by default 180 s, within the budget)."""
        dataset = await self.get_dataset(name_or_path)
        return HarborEnvironment(
            self.runtime,
            dataset,
            max_steps=max_steps,
            submit_keyword=submit_keyword,
            command_timeout_sec=command_timeout_sec,
            verify_on_truncation=verify_on_truncation,
            budget_sec=budget_sec,
            action_format=self.action_format,
            max_format_errors=self.max_format_errors,
            max_observation_chars=self.max_observation_chars,
            system_prompt=self.system_prompt,
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
