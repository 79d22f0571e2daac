"""`DockerEnvironment`: a generic shell task (image, instruction, verify command -> reward)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..env import BaseEnvironment, new_episode_id
from ..errors import EnvError
from ..types import Action, Observation, State, StepResult
from ._shield import shielded
from .container import Container, ContainerSpec
from .engine import DockerEngine
from .output import CommandResult
from .shell import ShellKind, ShellSession

__all__ = ["DockerEnvironment", "extract_command", "format_observation"]

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_command(text: str) -> str:
    """The first fenced code block's content, else the whole stripped text."""
    text = text.replace("\r\n", "\n")
    match = _FENCE.search(text)
    return (match.group(1) if match else text).strip()


def format_observation(result: CommandResult, timeout: float | None = None) -> str:
    """The command output, with a note when it failed, timed out or left the shell waiting."""
    parts = [result.output.rstrip("\n")] if result.output.strip() else []
    if result.continuation_prompt:
        parts.append(
            "[the shell was waiting for more input (unterminated quote, heredoc or block); "
            "the command was discarded]"
        )
    elif result.timed_out:
        after = f" after {timeout:g}s" if timeout is not None else ""
        parts.append(f"[command timed out{after} and was interrupted]")
    elif result.exit_code not in (0, None):
        parts.append(f"[exit code: {result.exit_code}]")
    if result.shell_restarted:
        parts.append("[the shell was restarted: working directory and variables were reset]")
    return "\n".join(parts)


class DockerEnvironment(BaseEnvironment):
    """A shell task: one container per instance (made on ``reset``, removed on ``aclose``);
    ``submit_keyword`` or ``max_steps`` ends it, and ``verify_command`` exit 0 -> reward 1.0.
    """

    pure_step = False
    reward_range = (0.0, 1.0)  # verify command: 1.0 on exit 0, else 0.0

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
    ) -> None:
        super().__init__(max_steps=max_steps)
        self.spec = dataclasses.replace(spec, image=image) if spec else ContainerSpec(image=image)
        self.instruction = instruction
        self.verify_command = verify_command
        self.setup_commands = tuple(setup_commands)
        self.submit_keyword = submit_keyword
        self.command_timeout = command_timeout
        self.verify_timeout = verify_timeout
        self.verify_on_truncation = verify_on_truncation
        self.max_output_bytes = max_output_bytes
        self.shell_kind: ShellKind = shell
        self._engine = engine
        self._owns_engine = engine is None
        self._container: Container | None = None
        self._session: ShellSession | None = None

    @classmethod
    def factory(cls, **kwargs: Any) -> Callable[[], Awaitable[DockerEnvironment]]:
        """An async zero-argument factory (an ``EnvFactory``) building instances from ``kwargs``."""

        async def make() -> DockerEnvironment:
            return cls(**kwargs)

        return make

    @property
    def container(self) -> Container | None:
        """The live container (``None`` before ``reset`` and after ``aclose``)."""
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
        self._container = container = await Container.create(engine, self.spec)
        try:
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

    async def _step(self, state: State, action: Action) -> StepResult:
        if self._session is None or self._container is None:
            raise EnvError("DockerEnvironment.step() before reset()")
        command = extract_command(action.text)
        step = state.step + 1
        info: dict[str, Any] = {"command": command}
        if command == self.submit_keyword:
            terminated, truncated, text = True, False, "Submitted."
        else:
            result = await self._session.run(command, timeout=self.command_timeout)
            text = format_observation(result, self.command_timeout)
            terminated, truncated = False, self.max_steps is not None and step >= self.max_steps
            info.update(
                exit_code=result.exit_code,
                timed_out=result.timed_out,
                continuation_prompt=result.continuation_prompt,
                duration_s=result.duration_s,
            )
        reward = 0.0
        if terminated or (truncated and self.verify_on_truncation):
            reward, info["verify"] = await self._verify()
        next_state = state.advance(
            action,
            Observation(text=text, data=dict(info)),
            terminated=terminated,
            truncated=truncated,
        )
        return StepResult.of(next_state, reward, info)

    async def _verify(self) -> tuple[float, dict[str, Any]]:
        """Run the verify command in a fresh exec; reward 1.0 when it exits 0."""
        if self.verify_command is None or self._container is None:
            return 0.0, {}
        result = await self._container.exec(
            ["/bin/sh", "-c", self.verify_command], timeout=self.verify_timeout
        )
        details = {"exit_code": result.exit_code, "output": result.output[-2000:]}
        return (1.0 if result.ok else 0.0), details

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
