"""`DockerEnvironment`: a generic shell task (image, instruction, verify command -> reward).

The step rules (the action format, submit, max_steps, format errors, verify on truncation,
observations, info keys) are ``ShellTaskEnvironment``'s, shared with ``HarborEnvironment``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .._shield import shielded
from ..env import new_episode_id
from ..errors import EnvError
from ..host import CommandResult, ShellKind, ShellSession
from ..protocols import AgentProtocol
from ..shell_task import (
    DEFAULT_MAX_OBSERVATION_CHARS,
    ShellTaskEnvironment,
    capped_timeout,
    format_observation,
)
from ..types import Observation, State
from .container import ContainerSpec
from .engine import DockerEngine
from .pool import WarmPool
from .runtime import Runtime, RuntimeHost, get_runtime

__all__ = ["DockerEnvironment", "format_observation"]


class DockerEnvironment(ShellTaskEnvironment):
    """A shell task: one container per instance (made on ``reset``, removed on ``aclose``);
    ``submit_keyword`` or ``max_steps`` ends it, and ``verify_command`` exit 0 -> reward 1.0
    (its exit code and output tail in ``info["verify"]``). With ``pool`` (a ``WarmPool``)
    ``reset`` takes a started container with its shell open (the pool's engine and shell
    settings apply) instead of creating one. ``runtime``: what starts the box, by name
    (``"runc"``: a Docker container; ``"gvisor"``: a gVisor sandbox, ``llenvs_async.sandbox``)
    or a ``Runtime``; it is checked here (``GvisorUnavailableError`` without runsc).
    """

    def __init__(
        self,
        *,
        image: str,
        instruction: str = "",
        verify_command: str | None = None,
        setup_commands: Sequence[str] = (),
        engine: DockerEngine | None = None,
        spec: ContainerSpec | None = None,
        max_steps: int | None = None,
        submit_keyword: str = "SUBMIT",
        command_timeout: float | None = 60.0,
        verify_timeout: float | None = 300.0,
        verify_on_truncation: bool = True,
        max_output_bytes: int = 16 * 1024,
        shell: ShellKind = "auto",
        pool: WarmPool | None = None,
        runtime: str | Runtime = "runc",
        action_format: str | AgentProtocol = "text",
        max_format_errors: int | None = 3,
        max_observation_chars: int | None = DEFAULT_MAX_OBSERVATION_CHARS,
        system_prompt: str | None = None,
    ) -> None:
        super().__init__(
            max_steps=max_steps,
            submit_keyword=submit_keyword,
            verify_on_truncation=verify_on_truncation,
            action_format=action_format,
            max_format_errors=max_format_errors,
            max_observation_chars=max_observation_chars,
            system_prompt=system_prompt,
        )
        self.spec = dataclasses.replace(spec, image=image) if spec else ContainerSpec(image=image)
        self.instruction = instruction
        self.verify_command = verify_command
        self.setup_commands = tuple(setup_commands)
        self.command_timeout = command_timeout
        self.verify_timeout = verify_timeout
        self.max_output_bytes = max_output_bytes
        self.shell_kind: ShellKind = shell
        self.runtime = get_runtime(runtime) if isinstance(runtime, str) else runtime
        if pool is not None and "warm_pool" not in self.runtime.capabilities:
            raise ValueError(
                f"DockerEnvironment: a warm pool holds Docker containers, not boxes of runtime "
                f"{self.runtime.name!r}: pass pool=None with runtime={self.runtime.name!r}"
            )
        self.runtime.check()  # now, naming what is missing (GvisorUnavailableError)
        if pool is not None and engine is not None and engine is not pool.engine:
            raise ValueError("DockerEnvironment: engine= and pool= must share one DockerEngine")
        self.pool = pool
        self._engine = pool.engine if pool is not None else engine
        self._owns_engine = self._engine is None
        self._container: RuntimeHost | None = None
        self._session: ShellSession | None = None

    @classmethod
    def factory(cls, **kwargs: Any) -> Callable[[], Awaitable[DockerEnvironment]]:
        """An async zero-argument factory (an ``EnvFactory``) building instances from ``kwargs``."""

        async def make() -> DockerEnvironment:
            return cls(**kwargs)

        return make

    @property
    def container_runtime(self) -> str:
        """The runtime's name (``"runc"``, ``"gvisor"``)."""
        return self.runtime.name

    @property
    def container(self) -> RuntimeHost | None:
        """The live container or sandbox (``None`` before ``reset`` and after ``aclose``)."""
        return self._container

    @property
    def session(self) -> ShellSession | None:
        return self._session

    async def _engine_connected(self) -> DockerEngine:
        if self._engine is None:
            self._engine = DockerEngine()
        return await self._engine.connect()

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        await self._remove_container()
        engine = await self._engine_connected()
        container: RuntimeHost
        if self.pool is not None:  # a started container with its shell open, if one is ready
            warm = await self.pool.take(self.spec)
            container, self._session = warm.container, warm.shell
        else:
            container = await self.runtime.create(engine, self.spec)
        self._container = container
        try:
            if self._session is None:
                self._session = await container.shell(
                    shell=self.shell_kind, max_output_bytes=self.max_output_bytes
                )
            for command in self.setup_commands:
                result = await self._session.run(command, timeout=self.command_timeout)
                if not result.ok:
                    raise EnvError(
                        f"setup command {command!r} failed in {self.spec.image!r} "
                        f"(exit {result.exit_code}): {result.output[-500:]}"
                    )
        except BaseException:
            await self._remove_container()
            raise
        return State(
            observation=Observation(text=self.instruction),
            task=task,
            episode_id=new_episode_id(),
            seed=seed,
            info={"container_id": container.id},
        )

    async def _run_command(
        self, command: str, timeout_sec: float | None = None
    ) -> tuple[CommandResult, float | None]:
        if self._session is None or self._container is None:
            raise EnvError("DockerEnvironment.step() before reset()")
        timeout = capped_timeout(self.command_timeout, timeout_sec)
        return await self._session.run(command, timeout=timeout), timeout

    async def _verify_episode(self) -> tuple[float, Mapping[str, Any]]:
        """Run the verify command in a fresh exec; reward 1.0 when it exits 0."""
        if self.verify_command is None or self._container is None:
            return 0.0, {}
        result = await self._container.exec(
            ["/bin/sh", "-c", self.verify_command], timeout=self.verify_timeout
        )
        details = {"exit_code": result.exit_code, "output": result.output[-2000:]}
        return (1.0 if result.ok else 0.0), {"verify": details}

    async def _remove_container(self) -> None:
        container, self._container, self._session = self._container, None, None
        if container is not None:
            await container.aclose()

    async def _aclose(self) -> None:
        try:
            await self._remove_container()
        finally:
            if self._owns_engine and self._engine is not None:
                await shielded(self._engine.aclose(), within=10)
