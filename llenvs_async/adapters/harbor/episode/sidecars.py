"""Compose sidecars run pod-style next to a task's main container.

The daemon here has no bridge network, so a sidecar joins the main container's network
namespace (``NetworkMode: container:<main>``): it listens on the main container's
``localhost``, and every service name is an ``/etc/hosts`` entry for ``127.0.0.1`` on the
main container (which its sidecars share). Each sidecar carries the ownership labels and
the task label (reaped like any of our containers), gets the task's memory and a pids
limit, no privileges, and is removed with its instance. Start order follows
``depends_on``; a sidecar whose healthcheck fails, or that exits, fails the reset with a
``ContainerError`` naming the service and its last output. Sidecar state is not part of
a snapshot: a restored or resumed episode starts its sidecars afresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from ...._resource import AsyncResource
from ....docker.container import Container, ContainerSpec
from ....docker.engine import DockerEngine
from ....errors import ContainerError, ImageError, LlenvsError
from ..images.image import TASK_IMAGE_LABEL, TaskImages
from ..tasks.compose import ComposeService, ComposeSpec, HealthCheck
from ..tasks.task import HarborTask

__all__ = ["SIDECAR_LABEL", "Sidecars", "extra_hosts", "start_sidecars"]

SIDECAR_LABEL = "llenvs.harbor.sidecar"
_SIDECAR_PIDS_LIMIT = 512
READY_TIMEOUT_SEC = 300.0
"""How long one sidecar may take to become ready (running, healthy or completed)."""
_OUTPUT_TAIL = 300


def extra_hosts(compose: ComposeSpec) -> tuple[str, ...]:
    """``/etc/hosts`` lines making every service name resolve to the shared loopback."""
    return tuple(f"{name}:127.0.0.1" for name in compose.service_names)


class Sidecars(AsyncResource):
    """The started sidecars of one episode; ``aclose`` removes them all (idempotent)."""

    def __init__(self) -> None:
        self.containers: dict[str, Container] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        containers, self.containers = list(self.containers.values()), {}
        errors: list[BaseException] = []
        for container in reversed(containers):
            try:
                await container.aclose()
            except (ContainerError, TimeoutError) as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


async def start_sidecars(
    engine: DockerEngine,
    images: TaskImages,
    task: HarborTask,
    main: Container,
    *,
    memory_bytes: int | None,
    cpus: float | None,
) -> Sidecars:
    """Start ``task``'s sidecars in ``main``'s network namespace, in dependency order,
    each one ready (running, healthy or completed, as its dependants ask) before the next;
    on any failure the ones already started are removed."""
    compose = task.compose
    assert compose is not None
    sidecars = Sidecars()
    try:
        waits = _conditions(compose)
        for service in compose.sidecars:
            image = await _image(engine, images, task, service)
            spec = ContainerSpec(
                image=image,
                command=await _argv(engine, image, service),
                env=service.environment,
                workdir=service.working_dir,
                user=service.user,
                network_mode=f"container:{main.id}",
                memory_bytes=memory_bytes,
                pids_limit=_SIDECAR_PIDS_LIMIT,
                cpus=cpus,
                labels={TASK_IMAGE_LABEL: task.name, SIDECAR_LABEL: service.name},
            )
            container = await Container.create(engine, spec)
            sidecars.containers[service.name] = container
            wait = waits.get(service.name, "service_started")
            try:
                async with asyncio.timeout(READY_TIMEOUT_SEC):
                    await _ready(task, service, container, wait)
            except TimeoutError:
                why = f"did not reach {wait} within {READY_TIMEOUT_SEC:g}s"
                raise _failure(task, service, why, await _logs(container)) from None
    except BaseException:
        await sidecars.aclose()
        raise
    return sidecars


def _conditions(compose: ComposeSpec) -> dict[str, str]:
    """What each sidecar must reach before the episode goes on: the strictest condition
    any service's ``depends_on`` names; a healthcheck is always awaited."""
    rank = {"service_started": 0, "service_healthy": 1, "service_completed_successfully": 2}
    wanted: dict[str, str] = {}
    for service in (compose.main, *compose.sidecars):
        for dep, condition in service.depends_on.items():
            if rank[condition] > rank[wanted.get(dep, "service_started")]:
                wanted[dep] = condition
    for service in compose.sidecars:
        if service.healthcheck is not None and service.name not in wanted:
            wanted[service.name] = "service_healthy"
    return wanted


async def _image(
    engine: DockerEngine, images: TaskImages, task: HarborTask, service: ComposeService
) -> str:
    if service.build_context is not None:
        dockerfile = service.build_context / service.dockerfile
        return await images.ensure_built(engine, task, dockerfile, service=service.name)
    assert service.image is not None
    image = await images.resolver.resolve(engine, service.image)
    if image is None:
        raise ImageError(
            f"task {task.name!r}: sidecar {service.name!r} needs image {service.image!r}, which "
            f"is not present locally; {images.resolver.how_to_map(service.image)}"
        )
    return image


async def _argv(engine: DockerEngine, image: str, service: ComposeService) -> tuple[str, ...]:
    """Compose's rule: ``entrypoint`` replaces the image's (and drops its CMD), ``command``
    replaces its CMD."""
    info = await engine.inspect_image(image) or {}
    config: Mapping[str, Any] = info.get("Config") or {}
    entrypoint = service.entrypoint
    if entrypoint is None:
        entrypoint = tuple(config.get("Entrypoint") or ())
        default_cmd: Sequence[str] = config.get("Cmd") or ()
    else:
        default_cmd = ()
    command = service.command if service.command is not None else tuple(default_cmd)
    argv = (*entrypoint, *command)
    if not argv:
        raise ContainerError(
            f"sidecar {service.name!r} ({image}) has no command: give one in the compose file"
        )
    return argv


async def _ready(
    task: HarborTask, service: ComposeService, container: Container, wait: str
) -> None:
    """Raise ``ContainerError`` unless the sidecar reaches ``wait``."""
    if wait == "service_completed_successfully":
        code = await _wait_exit(container)
        if code != 0:
            raise _failure(task, service, f"exited with code {code}", await _logs(container))
        return
    if wait == "service_healthy" and service.healthcheck is not None:
        await _healthy(task, service, container, service.healthcheck)
    state = (await container.inspect()).get("State") or {}
    if not state.get("Running"):
        code = state.get("ExitCode")
        raise _failure(task, service, f"exited with code {code}", await _logs(container))


async def _healthy(
    task: HarborTask, service: ComposeService, container: Container, check: HealthCheck
) -> None:
    """Run the healthcheck as Docker would: after ``start_period`` (failures there do not
    count), every ``interval``, until it passes or fails ``retries`` times in a row."""
    loop = asyncio.get_running_loop()
    grace_ends = loop.time() + check.start_period_sec
    failures = 0
    last = ""
    while True:
        state = (await container.inspect()).get("State") or {}
        if not state.get("Running"):
            why = f"exited with code {state.get('ExitCode')} before its healthcheck passed"
            raise _failure(task, service, why, await _logs(container))
        result = await container.exec(list(check.argv), timeout=check.timeout_sec)
        if result.exit_code == 0 and not result.timed_out:
            return
        last = result.output.strip() or ("timed out" if result.timed_out else "")
        if loop.time() >= grace_ends:
            failures += 1
            if failures >= check.retries:
                why = (
                    f"failed its healthcheck {check.retries} time(s) in a row "
                    f"({' '.join(check.argv)[:200]!r}, exit code {result.exit_code})"
                )
                raise _failure(task, service, why, last)
        await asyncio.sleep(check.interval_sec)


async def _wait_exit(container: Container) -> int | None:
    return await container.engine.wait_container(
        container.id, action="waiting for a sidecar to exit"
    )


async def _logs(container: Container) -> str:
    try:
        return await container.engine.container_logs(
            container.id, tail=20, action="reading a sidecar's logs"
        )
    except LlenvsError as exc:  # the logs only decorate the real error
        return f"(no logs: {exc})"


def _failure(task: HarborTask, service: ComposeService, why: str, output: str) -> ContainerError:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    tail = " | ".join(lines[-3:])[-_OUTPUT_TAIL:]
    said = f"; its last output: {tail}" if tail else ""
    return ContainerError(f"task {task.name!r}: sidecar {service.name!r} {why}{said}")
