"""``HarborEnvironment``: one Harbor task episode in a container driven through a persistent shell.

Rules: the initial observation holds the task's instruction; the step rules (the action
format, ``SUBMIT``, ``max_steps``, format errors, verify on truncation, observations, info
keys) are ``ShellTaskEnvironment``'s, shared with ``DockerEnvironment``; the terminal step
carries the verifier's reward.

Time budget (``[agent].timeout_sec``; only command time counts): ``budget.py``.
``state.hidden`` is a JSON-serialisable dict: task name and index, dataset, budget
total/used/left.

The episode's container, shell and sidecars: ``instance.py``; the engine it uses (the
adapter's, shared): ``engine_lease.py``; verifying it (collect hooks, the verifier in its
own exec or container, artifacts): ``verify/flow.py``; multi-step tasks (a step boundary
is an observation carrying the next instruction): ``steps.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Literal

from ....docker.container import Container
from ....docker.runtime import ForkPoint, RuntimeHost
from ....docker.snapshots import CommittedImage
from ....env import new_episode_id
from ....errors import ClosedError, ContinuationPromptError, EnvError, RestoreError
from ....host import CommandResult, ShellSession
from ....protocols import AgentProtocol
from ....shell_task import (
    DEFAULT_MAX_OBSERVATION_CHARS,
    ShellTaskEnvironment,
    capped_timeout,
    observation_text,
)
from ....types import Action, Observation, State, StepResult
from ..tasks.dataset import HarborDataset
from ..tasks.task import HarborTask
from ..verify.flow import verify_instance
from ..verify.verifier import VerifierResult
from . import steps as multi_step
from .budget import DEFAULT_COMMAND_TIMEOUT_SEC, CommandBudget
from .engine_lease import EngineLease
from .instance import DATASET_LABEL, HarborRuntime, Instance, start_instance
from .storage import StorageWatch

__all__ = [
    "DATASET_LABEL",
    "DEFAULT_COMMAND_TIMEOUT_SEC",
    "HarborEnvironment",
    "HarborRuntime",
]


class HarborEnvironment(ShellTaskEnvironment):
    """A Harbor task as an ``Environment``; ``pure_step=False`` (the container is the state).

    Cheap to create: the container starts in ``reset`` (by task index or name) and
    ``aclose`` removes it. Use ``HarborAdapter.get_environment`` to make one.
    """

    def __init__(
        self,
        runtime: HarborRuntime,
        dataset: HarborDataset,
        *,
        max_steps: int | None = 30,
        submit_keyword: str = "SUBMIT",
        command_timeout_sec: float | Literal["task"] = DEFAULT_COMMAND_TIMEOUT_SEC,
        verify_on_truncation: bool = True,
        budget_sec: float | Literal["task"] | None = "task",
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
        self._budget = CommandBudget(command_timeout_sec, budget_sec)
        self.runtime = runtime
        self.dataset = dataset
        self._engines = EngineLease(runtime, self)
        self._instance: Instance | None = None
        self._task: HarborTask | None = None
        self._task_index = -1
        self._workdir = "/"
        self._replaying = False
        self._step_index = 0
        self._step_results: list[dict[str, Any]] = []
        self._verifier: Container | None = None  # a separate verifier's, while it runs
        self._storage: StorageWatch | None = None  # the task's storage_mb, where measurable

    # -- public helpers -------------------------------------------------------------------

    @property
    def task(self) -> HarborTask | None:
        """The task of the current episode (``None`` before the first reset)."""
        return self._task

    @property
    def task_index(self) -> int:
        return self._task_index

    @property
    def workdir(self) -> str:
        """The container's working directory (the shell starts there)."""
        return self._workdir

    @property
    def container(self) -> RuntimeHost | None:
        """The episode's container, or its gVisor sandbox (``runtime="gvisor"``)."""
        return self._instance.container if self._instance is not None else None

    @property
    def container_runtime(self) -> Literal["runc", "gvisor"]:
        return self.runtime.container_runtime

    @property
    def shell(self) -> ShellSession | None:
        """The episode's persistent shell (``None`` before the first reset)."""
        return self._instance.shell if self._instance is not None else None

    @property
    def command_timeout_sec(self) -> float:
        """One command's time limit: the one given (180 s by default), else (``"task"``)
        the task's ``[agent].timeout_sec`` (Harbor bounds its oracle by it), else 180 s."""
        return self._budget.command_timeout(self._task)

    @property
    def budget_left_sec(self) -> float | None:
        """Seconds of command time left (``None``: no budget)."""
        return self._budget.left

    def list_tasks(self) -> list[tuple[int, str]]:
        return self.dataset.list_tasks()

    @contextmanager
    def replaying(self) -> Iterator[None]:
        """Replay mode: no budget, no truncation, no verifier; a continuation prompt raises
        ``ContinuationPromptError`` and a submit raises ``RestoreError``."""
        self._replaying = True
        try:
            yield
        finally:
            self._replaying = False

    def reanchor_budget(
        self,
        *,
        used_sec: float,
        budget_sec: float | None,
        replay_sec: float = 0.0,
        info: Mapping[str, Any] | None = None,
    ) -> State:
        """Set the budget to what a saved state had; returns the current state updated
        (``info`` is merged into its ``info``)."""
        current = self._current
        if current is None:
            raise EnvError("reanchor_budget() needs a reset environment")
        self._budget.total, self._budget.used = budget_sec, used_sec
        state = replace(
            current,
            hidden=self._hidden(),
            info={
                **current.info,
                "restored": True,
                "replay_sec": round(replay_sec, 6),
                **(info or {}),
            },
        )
        self._current = state
        return state

    async def probe(self, command: str, *, timeout_sec: float | None = None) -> str:
        """Run a read-only command in the episode's shell: no step, no budget, no verifier."""
        self._ensure_open()
        shell = self._require_shell()
        limit = timeout_sec or self.command_timeout_sec
        return observation_text(await shell.run(command, timeout=limit), limit)

    async def verify(self) -> VerifierResult:
        """Run the ``[[verifier.collect]]`` hooks, then the verifier (shared: ``tests/`` uploaded
        to ``/tests`` here; separate: its own container, given the artifacts) and read the
        reward (and a log tail); artifacts are kept when the runtime has an artifacts dir."""
        async with self._engines.held():  # closed meanwhile: its engine use ends after
            return await self._verify()

    async def _verify(self) -> VerifierResult:
        instance, task = self._require_instance(), self._require_task()
        return await verify_instance(
            instance,
            task,
            runtime=self.runtime,
            engine=self._engines.get,
            cfg=multi_step.verifier_config(task, self._step_index),
            tests=multi_step.tests_dirs(task, self._step_index),
            episode_dir=self._episode_dir(),
            dataset_spec=self.dataset.spec,
            track=self._track_verifier,
        )

    def _episode_dir(self) -> str:
        current = self._current
        name = current.episode_id if current is not None else new_episode_id()
        task = self._require_task()
        return f"{name}/{task.steps[self._step_index].name}" if task.steps else name

    async def resume(self, point: ForkPoint | CommittedImage, state: State) -> State:
        """Continue ``state`` in a new box started from ``point``, taken of an episode at
        ``state`` (the caller vouches for that): a commit of its filesystem (a fresh shell)
        or a gVisor checkpoint (processes and the shell as they were); a new episode id."""
        self._ensure_open()
        if isinstance(point, CommittedImage):
            start = await self._start(state.task, seed=state.seed, image=point.image)
        else:
            start = await self._start(state.task, seed=state.seed, image=None, checkpoint=point)
        if isinstance(state.hidden, Mapping) and self._require_task().steps:
            self._step_index = int(state.hidden.get("step_index", 0))
            self._step_results = [dict(r) for r in state.hidden.get("step_results", [])]
            self._restart_budget()
        resumed = replace(state, episode_id=start.episode_id, hidden=self._hidden())
        self._current = resumed
        return resumed

    # -- Environment template methods -------------------------------------------------------

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        return await self._start(task, seed=seed, image=None)

    async def _start(
        self,
        task: int | str | None,
        *,
        seed: int | None,
        image: str | None,
        checkpoint: ForkPoint | None = None,
    ) -> State:
        """Start the task's container (from ``image`` if given, else the task image; from
        ``checkpoint``: restore that gVisor sandbox)."""
        try:
            index, harbor_task = self.dataset.resolve(task)
        except (KeyError, IndexError, ValueError) as exc:
            raise EnvError(str(exc).strip("'\"")) from exc
        await self._drop_container()
        instance = await start_instance(
            self.runtime,
            await self._engines.get(),
            harbor_task,
            dataset_spec=self.dataset.spec,
            image=image,
            checkpoint=checkpoint,
        )
        self._instance, self._workdir = instance, instance.workdir
        self._task, self._task_index = harbor_task, index
        box, storage_mb = instance.container, harbor_task.config.environment.storage_mb
        self._storage = StorageWatch(box, storage_mb) if "storage" in box.capabilities else None
        self._step_index, self._step_results = 0, []
        self._restart_budget()
        if harbor_task.steps and image is None and checkpoint is None:  # a resumed box is past it
            await multi_step.enter_step(self, 0)
        return State(
            observation=Observation(
                text=self._initial_text(harbor_task), data={"workdir": self._workdir}
            ),
            task=task,
            step=0,
            episode_id=new_episode_id(),
            hidden=self._hidden(),
            seed=seed,
        )

    async def _run_command(
        self, command: str, timeout_sec: float | None = None
    ) -> tuple[CommandResult, float]:
        return await self._run(command, timeout_sec)

    async def _verify_episode(self) -> tuple[float, Mapping[str, Any]]:
        if self._storage is not None and self._storage.breach is not None:
            over = VerifierResult(reward=0.0, rewards={"reward": 0.0}, source="storage-limit",
                                  output=self._storage.breach)  # fmt: skip
            return over.reward, over.info()  # the limit is the task's: not verified further
        verdict = await self.verify()
        task = self._require_task()
        if not task.steps:
            return verdict.reward, verdict.info()
        return multi_step.final_verdict(self, task, verdict)  # truncated mid-step

    async def _step(self, state: State, action: Action) -> StepResult:
        task = self._task
        if task is None or not task.steps or not self.is_submit(action):
            return await super()._step(state, action)
        return await multi_step.submit_step(self, state, action, task)

    def _restart_budget(self) -> None:
        """The budget of the current step (multi-step) or episode: the agent timeout unless
        the environment was given one."""
        self._budget.restart(multi_step.agent_timeout(self._require_task(), self._step_index))

    def _before_submit(self, step: int) -> None:
        if self._replaying:
            raise RestoreError(f"the replayed prefix submits at step {step}", step=step)

    def _after_command(self, command: str, result: CommandResult, step: int) -> None:
        if result.continuation_prompt and self._replaying:
            raise ContinuationPromptError(
                f"replayed command at step {step} left the shell at a continuation prompt "
                f"(unterminated quote, heredoc or block): {command[:200]!r}",
                command=command,
                step=step,
            )

    async def _aclose(self) -> None:
        try:
            await self._drop_container()
        finally:
            await self._engines.end()  # a verification still in flight releases it later

    # -- internals --------------------------------------------------------------------------

    def _truncation(self, step: int) -> tuple[str, str] | None:
        """The time budget, then ``max_steps``; never while replaying a saved prefix."""
        if self._replaying:
            return None
        if self._storage is not None and self._storage.breach is not None:
            return "storage_limit", self._storage.breach
        return self._budget.truncation() or super()._truncation(step)

    async def _run(self, command: str, asked: float | None = None) -> tuple[CommandResult, float]:
        """Run an agent command (``asked``: the model's own shorter limit); outside a replay
        its time is charged to the budget."""
        shell = self._require_shell()
        cap = capped_timeout(self.command_timeout_sec, asked)
        assert cap is not None
        watch = None if self._replaying else self._storage
        ran = await self._budget.run(
            shell, command, cap, charged=not self._replaying,
            stop=None if watch is None else watch.during,
        )  # fmt: skip
        if watch is not None and ran[0].stopped is None:
            await watch.after()
            if watch.full and watch.breach is None:  # a write stopped at the limit, say
                result, timeout = ran
                output = "\n".join(part for part in (result.output.rstrip(), watch.note) if part)
                return replace(result, output=output), timeout
        return ran

    def _hidden(self) -> dict[str, Any]:
        task = self._require_task()
        hidden: dict[str, Any] = {
            "task_name": task.name,
            "task_index": self._task_index,
            "dataset": self.dataset.spec,
            **self._budget.hidden(),
        }
        if task.steps:
            hidden["step_index"] = self._step_index
            hidden["step_name"] = task.steps[self._step_index].name
            hidden["step_results"] = [dict(r) for r in self._step_results]
        return hidden

    def _initial_text(self, task: HarborTask) -> str:
        if task.steps:
            return multi_step.step_text(task, 0, self.submit_keyword, self._workdir)
        return self._framed(task.instruction, self._workdir)

    def frame_task(self, instruction: str) -> str:
        """An example task worded as a first message is: with the first task's working
        directory (no episode has started when the runner asks)."""
        tasks = self.dataset.tasks
        return self._framed(instruction, tasks[0].declared_workdir if tasks else "/")

    def _framed(self, instruction: str, workdir: str) -> str:
        return (
            f"{instruction}\n\n"
            f"You are in a bash shell inside a Linux container, in {workdir}. Run one "
            f"command at a time and read its output; when the task is done, submit "
            f"({self.submit_keyword})."
        )

    def _track_verifier(self, container: Container | None) -> None:
        if container is not None and self.closed:
            raise ClosedError(f"{type(self).__name__} (closed during its verification)")
        self._verifier = container

    async def _drop_container(self) -> None:
        instance, self._instance = self._instance, None
        verifier, self._verifier = self._verifier, None
        try:
            if verifier is not None:
                await verifier.aclose()
        finally:
            if instance is not None:
                await instance.aclose()

    def _require_instance(self) -> Instance:
        if self._instance is None:
            raise EnvError("HarborEnvironment has no container: call reset() first")
        return self._instance

    def _require_shell(self) -> ShellSession:
        if self._instance is None:
            raise EnvError("HarborEnvironment has no shell: call reset() first")
        return self._instance.shell

    def _require_task(self) -> HarborTask:
        if self._task is None:
            raise EnvError("HarborEnvironment has no task: call reset() first")
        return self._task
