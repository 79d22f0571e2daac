"""The running instance of a Harbor episode: its container (or gVisor sandbox), shell and sidecars.

Containers get the task's ``cpus`` and ``memory_mb``, and ``storage_mb`` as the largest
file a process may write (the total is watched by the episode: ``storage.py``); tasks asking
for GPUs are refused. A compose task's
sidecars join the main container's network namespace (``sidecars.py``); a failure part
way removes what was started, so no half-made pod outlives a failed reset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ....docker.container import Container, ContainerSpec
from ....docker.engine import DockerEngine
from ....docker.pool import WarmPool
from ....docker.runtime import ForkPoint, Runtime, RuntimeHost, get_runtime
from ....errors import ContainerError, EnvError
from ....host import ShellSession
from ..images.image import TASK_IMAGE_LABEL, TaskImages
from ..tasks.task import HarborTask, resolve_env
from .sidecars import Sidecars, extra_hosts, start_sidecars

__all__ = [
    "DATASET_LABEL",
    "HarborRuntime",
    "Instance",
    "as_docker",
    "daemon_has_bridge",
    "start_instance",
]

DATASET_LABEL = "llenvs.harbor.dataset"
_MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class HarborRuntime:
    """What every environment of one adapter shares: the image cache and the Docker settings."""

    images: TaskImages
    allow_network: bool = False
    docker_url: str | None = None
    engine: DockerEngine | None = None
    pool: WarmPool | None = None
    artifacts_dir: Path | None = None
    """Where verified episodes' artifacts are kept (``<task>/<episode>/...``); None: not kept."""
    engine_users: set[int] | None = None
    """Environments using ``engine`` now; when the last one closes the engine disconnects
    (reconnecting on next use), so an adapter that is never closed leaks no connection.
    ``None``: the engine's owner closes it (a caller's engine, or a warm pool's)."""
    container_runtime: Literal["runc", "gvisor"] = "runc"


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    """One episode's running box: the agent's container and shell, its sidecars, its network."""

    container: RuntimeHost
    shell: ShellSession
    sidecars: Sidecars | None
    network: bool
    """The container was given a network (the run allows it and the task asks)."""
    bridge: bool
    """That network reaches beyond loopback (the daemon has a bridge)."""
    workdir: str

    async def aclose(self) -> None:
        """Remove the sidecars, then the container (idempotent: both are)."""
        try:
            if self.sidecars is not None:
                await self.sidecars.aclose()
        finally:
            await self.container.aclose()


def as_docker(container: RuntimeHost) -> Container:
    """The agent's container where only a Docker one will do (archives, sidecars)."""
    if not isinstance(container, Container):
        raise EnvError("artifacts and sidecars need a Docker container (runtime='runc')")
    return container


async def start_instance(
    runtime: HarborRuntime,
    engine: DockerEngine,
    task: HarborTask,
    *,
    dataset_spec: str,
    image: str | None,
    checkpoint: ForkPoint | None = None,
) -> Instance:
    """Start ``task``'s box on the run's runtime from ``image`` (else the task image; from
    ``checkpoint``: resume that box), with its shell and sidecars. Only the task image
    comes from the warm pool: a snapshot image is one state's, so spares of it would only
    wait, and would pin the image past the snapshot's removal."""
    env_cfg = task.config.environment
    from_snapshot = image is not None
    if env_cfg.gpus:
        raise EnvError(f"task {task.name!r} needs {env_cfg.gpus} GPU(s); none offered")
    if checkpoint is None:
        image = image or await runtime.images.ensure(engine, task)
    else:
        image = checkpoint.image
    network = runtime.allow_network and env_cfg.wants_network
    bridge = network and await daemon_has_bridge(engine)
    agent_user = task.config.agent.user
    compose = task.compose
    spec = ContainerSpec(
        image=image,
        env={
            **resolve_env(env_cfg.env, task.name),
            **(compose.main.environment if compose else {}),
        },
        extra_hosts=extra_hosts(compose) if compose else (),
        workdir=env_cfg.workdir,
        user=None if agent_user is None else str(agent_user),
        network_mode="bridge" if network else "none",
        memory_bytes=env_cfg.memory_mb * _MIB,
        cpus=env_cfg.cpus,
        max_file_bytes=env_cfg.storage_mb * _MIB,
        labels={TASK_IMAGE_LABEL: task.name, DATASET_LABEL: dataset_spec},
    )
    box_runtime = get_runtime(runtime.container_runtime)
    _check_capabilities(task, box_runtime, keep_artifacts=runtime.artifacts_dir is not None)
    container: RuntimeHost
    if checkpoint is not None:
        container, shell = await checkpoint.resume(engine.labels)
    elif runtime.pool is not None and "warm_pool" in box_runtime.capabilities and not from_snapshot:
        warm = await runtime.pool.take(spec)  # started, shell open: no create
        container, shell = warm.container, warm.shell
    else:
        container = await box_runtime.create(engine, spec)
        try:
            shell = await container.shell()
        except BaseException:
            await container.aclose()
            raise
    sidecars = None
    try:
        if compose is not None and compose.sidecars:
            sidecars = await start_sidecars(
                engine, runtime.images, task, as_docker(container),
                memory_bytes=spec.memory_bytes, cpus=spec.cpus,
            )  # fmt: skip
        details = await container.inspect()
    except BaseException:
        await Instance(
            container=container, shell=shell, sidecars=sidecars, network=network,
            bridge=bridge, workdir="/",
        ).aclose()  # fmt: skip
        raise
    workdir = env_cfg.workdir or (details.get("Config") or {}).get("WorkingDir") or "/"
    return Instance(
        container=container, shell=shell, sidecars=sidecars, network=network, bridge=bridge,
        workdir=workdir,
    )  # fmt: skip


async def daemon_has_bridge(engine: DockerEngine) -> bool:
    """Whether the daemon has its default ``bridge`` network (not under ``--bridge=none``)."""
    try:
        found = await engine.request_json(
            "GET", "networks", params={"filters": json.dumps({"name": ["bridge"]})}
        )
    except ContainerError:
        return True  # unknown: say nothing about the bridge
    return any(isinstance(n, dict) and n.get("Name") == "bridge" for n in found or [])


def _check_capabilities(task: HarborTask, runtime: Runtime, *, keep_artifacts: bool) -> None:
    """Refuse what the runtime's boxes cannot host: sidecars joined to the box's network
    namespace, and artifacts copied out as tar archives (separate verifier, artifacts_dir)."""
    can = runtime.capabilities
    what = None
    if task.compose is not None and task.compose.sidecars and "sidecars" not in can:
        what = "compose sidecars (they join a Docker container's network namespace)"
    elif task.config.verifier.separate and "archives" not in can:
        what = "a separate verifier environment (its artifacts are copied out as an archive)"
    elif keep_artifacts and "archives" not in can:
        what = "artifacts_dir (artifacts are copied out as an archive)"
    if what is not None:
        raise EnvError(
            f"task {task.name!r}: runtime={runtime.name!r} does not support {what}; use runc"
        )
