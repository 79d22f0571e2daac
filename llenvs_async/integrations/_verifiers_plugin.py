# mypy: disallow-subclassing-any=False, disallow-untyped-decorators=False
"""The verifiers v1 plugin: a Taskset of Harbor tasks and a Harness that plays one with our runner.

Imported only by ``llenvs_async.integrations.verifiers`` (after it checked that verifiers is
installed): these classes subclass verifiers' own, so this module imports verifiers at the
top. Importing it registers it under ``PLUGIN_ID``, the top-level name verifiers' plugin
loader imports a taskset or harness id as.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import weakref
from pathlib import Path
from typing import Any, Literal

import verifiers.v1 as vf  # type: ignore[import-untyped]
from pydantic import Field
from verifiers.v1.clients import ModelContext  # type: ignore[import-untyped]
from verifiers.v1.configs.harness import HarnessConfig  # type: ignore[import-untyped]
from verifiers.v1.configs.taskset import TasksetConfig  # type: ignore[import-untyped]
from verifiers.v1.harness import Harness  # type: ignore[import-untyped]
from verifiers.v1.runtimes import ProgramResult, Runtime  # type: ignore[import-untyped]
from verifiers.v1.state import State  # type: ignore[import-untyped]
from verifiers.v1.task import Task, TaskData  # type: ignore[import-untyped]
from verifiers.v1.taskset import Taskset  # type: ignore[import-untyped]
from verifiers.v1.trace import Trace  # type: ignore[import-untyped]
from verifiers.v1.types import TurnTokens  # type: ignore[import-untyped]

from llenvs_async import LlenvsError, OpenAIBackend, SamplingParams, Trajectory, TrajectoryRunner
from llenvs_async.adapters.harbor import HarborAdapter, load_local_dataset
from llenvs_async.integrations.verifiers import PLUGIN_ID, TURN_TOKENS_KEY

__all__ = ["LlenvsHarness", "LlenvsTaskset"]

sys.modules.setdefault(PLUGIN_ID, sys.modules[__name__])

LIVE: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
"""Tasks running an episode of ours in this process: a server waits for their teardown."""


class LlenvsTaskData(TaskData):
    """One Harbor task on the wire: where its dataset lives and which task it is."""

    source: str
    """The local directory of Harbor tasks (the server must see the same path)."""
    task: str
    """The task's full name in that dataset."""


class LlenvsState(State):
    """What our runner reports about the episode, read by the task's reward."""

    reward: float = 0.0
    total_reward: float = 0.0
    success: bool = False
    stop_reason: str = ""
    num_steps: int = 0
    truncation_reason: str | None = None


class LlenvsTask(Task[LlenvsTaskData, LlenvsState]):
    """A Harbor task scored by its own verifier (our environment's terminal reward)."""

    @vf.reward
    async def environment_reward(self, trace: Trace) -> float:
        state = trace.state
        assert isinstance(state, LlenvsState)
        return state.total_reward

    @vf.metric
    async def llenvs_steps(self, trace: Trace) -> float:
        state = trace.state
        assert isinstance(state, LlenvsState)
        return float(state.num_steps)

    @vf.metric
    async def llenvs_sampled_tokens(self, trace: Trace) -> float:
        """Sampled token ids the engine reported to our backend (0 when it reports none)."""
        turns = trace.info.get(TURN_TOKENS_KEY, ())
        return float(sum(len(turn["completion_ids"]) for turn in turns))


class LlenvsTasksetConfig(TasksetConfig):
    """``source``: a local directory of Harbor tasks; ``tasks``: names to keep (all if empty)."""

    source: str = ""
    tasks: list[str] = Field(default_factory=list)


class LlenvsTaskset(Taskset[LlenvsTask, LlenvsTasksetConfig]):
    """The tasks of a local Harbor dataset, in its stable order (client side: no container)."""

    def load(self) -> list[LlenvsTask]:
        source = self.config.source
        if not source or not Path(source).is_dir():
            raise LlenvsError(
                f"taskset.source must be a local directory of Harbor tasks, got {source!r}",
                field="taskset.source",
                value=source,
            )
        dataset = load_local_dataset(source)
        wanted = list(self.config.tasks)
        names = [task.name for task in dataset.tasks]
        if wanted:
            names = [dataset.tasks[dataset.index_of(name)].name for name in wanted]
        by_name = {task.name: task for task in dataset.tasks}
        return [
            LlenvsTask(
                LlenvsTaskData(
                    id=name,
                    name=name,
                    prompt=by_name[name].instruction,
                    source=dataset.source,
                    task=name,
                ),
                self.config.task,
            )
            for name in names
        ]


class LlenvsHarnessConfig(HarnessConfig):
    """How our runner plays a task: the agent protocol, the container runtime, the limits."""

    id: str = PLUGIN_ID
    max_steps: int = Field(30, ge=1)
    action_format: Literal["text", "tools"] = "tools"
    container_runtime: Literal["runc", "gvisor"] = "runc"
    step_timeout: float | None = Field(None, gt=0)
    command_timeout_sec: float = Field(180.0, gt=0)
    max_tokens: int = Field(512, ge=1)
    """Used when the caller's sampling sets none (the caller's sampling wins)."""
    context_length: int | None = Field(None, ge=1)
    tool_choice: str | None = None
    system_prompt: str | None = None


class LlenvsHarness(Harness[LlenvsHarnessConfig]):
    """Plays one task with ``TrajectoryRunner`` in this process, in a container of ours.

    Every model call goes to the rollout's interception ``endpoint`` (verifiers records each
    turn); each turn's token ids and logprobs, as the engine returned them to our backend, go
    in ``trace.info[TURN_TOKENS_KEY]``. The runner's own teardown removes the container on
    success, error and cancellation. A failed rollout ends the trace with an error, never
    dropped.
    """

    NEEDS_CONTAINER = False  # the task's container is ours, not the verifiers runtime
    EXECUTES_CODE = False  # nothing runs in the verifiers runtime

    async def launch(
        self,
        ctx: ModelContext,
        trace: Trace,
        runtime: Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: TaskData,
    ) -> ProgramResult:
        if not isinstance(data, LlenvsTaskData):
            raise LlenvsError(
                f"{PLUGIN_ID} plays tasks of its own taskset, got {type(data).__name__}",
                field="task_data",
                value=type(data).__name__,
            )
        task = asyncio.current_task()
        if task is not None:
            LIVE.add(task)
        trajectory = await self._play(ctx, endpoint, secret, data)
        state = trace.state
        assert isinstance(state, LlenvsState)
        state.total_reward = trajectory.total_reward
        state.reward = trajectory.transitions[-1].reward if trajectory.transitions else 0.0
        state.success = trajectory.success
        state.stop_reason = str(trajectory.stop_reason)
        state.num_steps = len(trajectory.transitions)
        last = trajectory.transitions[-1].info if trajectory.transitions else {}
        state.truncation_reason = last.get("truncation_reason")
        # The trace's nodes get tokens only from verifiers' train client, and its state does
        # not cross the wire: the engine's ids ride in ``info``, as verifiers' TurnTokens.
        trace.info[TURN_TOKENS_KEY] = [
            TurnTokens(
                prompt_ids=list(completion.prompt_token_ids),
                completion_ids=list(completion.token_ids),
                completion_logprobs=list(completion.logprobs or ()),
            ).model_dump(mode="python")
            for completion in (t.completion for t in trajectory.transitions)
            if completion is not None
        ]
        if trajectory.error is not None:
            error = trajectory.error
            return ProgramResult(exit_code=1, stdout="", stderr=f"{error.type}: {error.message}")
        return ProgramResult(exit_code=0, stdout=state.stop_reason, stderr="")

    async def _play(
        self, ctx: ModelContext, endpoint: str, secret: str, data: LlenvsTaskData
    ) -> Trajectory:
        cfg = self.config
        adapter = HarborAdapter(runtime=cfg.container_runtime, action_format=cfg.action_format)

        async def factory() -> Any:
            return await adapter.get_environment(
                data.source, max_steps=cfg.max_steps, command_timeout_sec=cfg.command_timeout_sec
            )

        max_tokens = ctx.sampling.max_tokens or cfg.max_tokens
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(adapter.aclose)
            backend = OpenAIBackend(
                endpoint,
                ctx.model,
                api_key=secret,
                # a vLLM server behind verifiers' eval client then returns token ids too
                vllm_extras=True,
                context_length=cfg.context_length,
                max_retries=0,  # verifiers records a failed call; a retry would hide it
            )
            stack.push_async_callback(backend.aclose)
            prototype = await stack.enter_async_context(await factory())
            runner = TrajectoryRunner(
                prototype,
                backend,
                SamplingParams(max_tokens=max_tokens, logprobs=0),  # sampled tokens only
                env_factory=factory,
                max_steps=cfg.max_steps,
                step_timeout=cfg.step_timeout,
                system_prompt=cfg.system_prompt,
                tool_choice=cfg.tool_choice,
            )
            stack.push_async_callback(runner.aclose)
            [trajectory] = await runner.run_batch([data.task])
        return trajectory
