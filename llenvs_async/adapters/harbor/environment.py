"""``HarborEnvironment``: one Harbor task episode in a container driven through a persistent shell.

Rules: the initial observation holds the task's instruction; the step rules (command
parsing, ``SUBMIT``, ``max_steps``, verify on truncation, observations, info keys) are
``ShellTaskEnvironment``'s, shared with ``DockerEnvironment``; the terminal step carries
the verifier's reward.

Time budget (``[agent].timeout_sec``): only command time counts (not the time the
agent spends generating), each command's timeout is ``min(budget left, per-command
cap)``, and running out truncates the episode with ``info["truncation_reason"]``
= ``"agent_timeout"``. ``state.hidden`` is a JSON-serialisable dict: task name and
index, dataset, budget total/used/left.

Containers get the task's ``cpus`` and ``memory_mb``; ``storage_mb`` is not enforced
(overlay2 quotas need xfs) and tasks asking for GPUs are refused. The verifier runs
in its own exec (not the agent's shell), as Harbor does, or in a container of its own
(``verification.py``); artifacts and collect hooks: ``artifacts.py``; multi-step tasks
(a step boundary is an observation carrying the next instruction): ``steps.py``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ...docker.container import Container, ContainerSpec
from ...docker.engine import DockerEngine
from ...docker.output import CommandResult
from ...docker.pool import WarmPool
from ...docker.shell import ShellSession
from ...docker.shell_task import (
    SUBMITTED_TEXT,
    ShellTaskEnvironment,
    extract_command,
    observation_text,
)
from ...env import new_episode_id
from ...errors import (
    ClosedError,
    ContainerError,
    ContinuationPromptError,
    EnvError,
    RestoreError,
    VerifierError,
)
from ...types import Action, Observation, State, StepResult
from . import steps as multi_step
from .artifacts import collect_artifacts, run_collect_hooks, save_artifacts, transfer_tar
from .dataset import HarborDataset
from .image import TASK_IMAGE_LABEL, TaskImages
from .provision import offline_test_sh
from .sidecars import Sidecars, extra_hosts, start_sidecars
from .task import HarborTask, VerifierConfig, resolve_env
from .verification import run_separate, run_tests, verifier_environment
from .verifier import VerifierResult

if TYPE_CHECKING:
    from ...sandbox.fork import SandboxCheckpoint
    from ...sandbox.sandbox import Sandbox

__all__ = [
    "DATASET_LABEL",
    "HarborEnvironment",
    "HarborRuntime",
    "format_observation",
    "parse_command",
]

DATASET_LABEL = "llenvs.harbor.dataset"
DEFAULT_COMMAND_TIMEOUT_SEC = 600.0
"""A command's time limit when the task gives no ``[agent].timeout_sec``."""
# What a download failing for want of a network prints (curl, wget, pip, uv, apt, git, python).
_NO_NETWORK_RE = re.compile(
    r"Could not resolve host|Temporary failure (?:in name resolution|resolving)|"
    r"Name or service not known|Network is unreachable|Failed to establish a new connection|"
    r"unable to resolve host|failed to lookup address|No address associated with hostname|"
    r"dns error",
    re.IGNORECASE,
)
_MIB = 1 << 20
_VERIFIER_TAIL_CHARS = 4000


# One rule for every shell-task environment (kept under the names this package exported).
parse_command = extract_command
format_observation = observation_text


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


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
        command_timeout_sec: float | Literal["task"] = "task",
        verify_on_truncation: bool = True,
        budget_sec: float | Literal["task"] | None = "task",
    ) -> None:
        super().__init__(
            max_steps=max_steps,
            submit_keyword=submit_keyword,
            verify_on_truncation=verify_on_truncation,
        )
        if command_timeout_sec != "task" and not _positive(command_timeout_sec):
            raise ValueError(
                f"command_timeout_sec is seconds > 0 or 'task', got {command_timeout_sec!r}"
            )
        if budget_sec != "task" and not (budget_sec is None or _positive(budget_sec)):
            raise ValueError(
                f"budget_sec is seconds > 0, None (unlimited) or 'task', got {budget_sec!r}"
            )
        self.runtime = runtime
        self.dataset = dataset
        self._command_timeout = command_timeout_sec
        self._network = False
        self._bridge = False
        self._budget_override = budget_sec
        self._engine: DockerEngine | None = None
        self._container: Container | Sandbox | None = None
        self._sidecars: Sidecars | None = None
        self._shell: ShellSession | None = None
        self._task: HarborTask | None = None
        self._task_index = -1
        self._workdir = "/"
        self._budget_sec: float | None = None
        self._used_sec = 0.0
        self._replaying = False
        self._step_index = 0
        self._step_results: list[dict[str, Any]] = []
        self._verifier: Container | None = None  # a separate verifier's, while it runs
        self._verifying = 0  # verifications in flight (closing waits for them to let go)

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
    def container(self) -> Container | Sandbox | None:
        """The episode's container, or its gVisor sandbox (``runtime="gvisor"``)."""
        return self._container

    @property
    def container_runtime(self) -> Literal["runc", "gvisor"]:
        return self.runtime.container_runtime

    @property
    def shell(self) -> ShellSession | None:
        """The episode's persistent shell (``None`` before the first reset)."""
        return self._shell

    @property
    def command_timeout_sec(self) -> float:
        """One command's time limit: the one given, else (``"task"``) the task's
        ``[agent].timeout_sec`` (Harbor bounds its oracle by it), else 600 s."""
        if self._command_timeout != "task":
            return float(self._command_timeout)
        task_limit = self._task.config.agent.timeout_sec if self._task is not None else None
        return task_limit or DEFAULT_COMMAND_TIMEOUT_SEC

    @property
    def budget_left_sec(self) -> float | None:
        """Seconds of command time left (``None``: no budget)."""
        if self._budget_sec is None:
            return None
        return max(0.0, self._budget_sec - self._used_sec)

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
        self._budget_sec = budget_sec
        self._used_sec = used_sec
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
        return format_observation(await shell.run(command, timeout=limit), limit)

    async def verify(self) -> VerifierResult:
        """Run the ``[[verifier.collect]]`` hooks, then the verifier (shared: ``tests/`` uploaded
        to ``/tests`` here; separate: its own container, given the artifacts) and read the
        reward (and a log tail); artifacts are kept when the runtime has an artifacts dir."""
        self._verifying += 1
        try:
            return await self._verify()
        finally:
            self._verifying -= 1
            if self.closed and not self._verifying:  # closed meanwhile: its engine use ends now
                await self._release_engine()

    async def _verify(self) -> VerifierResult:
        container = self._require_container()
        task = self._require_task()
        cfg = self._verifier_config()
        hooks = await run_collect_hooks(
            {"main": container}, task.config.verifier.collect, task_name=task.name
        )
        collected = []
        if cfg.separate:
            collected = await collect_artifacts(
                self._docker_container(), task.config.artifacts, task_name=task.name
            )
            result, log = await run_separate(
                await self._get_engine(),
                self.runtime.images,
                task,
                artifacts=transfer_tar(collected),
                allow_network=self.runtime.allow_network,
                labels={DATASET_LABEL: self.dataset.spec},
                explain=lambda log, network: self._check_offline_verifier(task, log, network),
                track=self._track_verifier,
            )
        else:
            result, log = await run_tests(
                container,
                task=task,
                timeout_sec=cfg.timeout_sec,
                env=cfg.env,
                workdir=self._workdir,
                user=cfg.user,
                tests=self._tests_dirs(),
                explain=lambda log: self._check_offline_verifier(task, log, self._network),
                offline=self._offline_verifier(task),
            )
            if self.runtime.artifacts_dir is not None:  # Harbor collects after verification
                collected = await collect_artifacts(
                    self._docker_container(), task.config.artifacts, task_name=task.name
                )
        extra: dict[str, Any] = {}
        if hooks:
            extra["collect_hooks"] = hooks
        if collected:
            extra["artifacts"] = [item.manifest() for item in collected]
        if self.runtime.artifacts_dir is not None and collected:
            where = self.runtime.artifacts_dir / task.short_name / self._episode_dir()
            await save_artifacts(collected, where)
            extra["artifacts_dir"] = str(where)
        return replace(result, output=log[-_VERIFIER_TAIL_CHARS:], extra=extra)

    def _verifier_config(self) -> VerifierConfig:
        """The current step's ``[steps.verifier]`` (task's as fallback), else ``[verifier]``."""
        task = self._require_task()
        if task.steps:
            return task.steps[self._step_index].config.verifier
        return task.config.verifier

    def _tests_dirs(self) -> list[Path]:
        """``tests/`` then the current step's own ``tests/`` (its files win), as Harbor does."""
        task = self._require_task()
        dirs = [task.tests_dir] if task.tests_dir.is_dir() else []
        if task.steps and (own := task.steps[self._step_index].tests_dir) is not None:
            dirs.append(own)
        return dirs

    def _episode_dir(self) -> str:
        current = self._current
        name = current.episode_id if current is not None else new_episode_id()
        task = self._require_task()
        return f"{name}/{task.steps[self._step_index].name}" if task.steps else name

    def _offline_verifier(self, task: HarborTask) -> tuple[str, dict[str, str]] | None:
        """The provisioned ``test.sh`` and its environment, when the image was provisioned."""
        if not self.runtime.images.build.provision_verifier or task.dockerfile is None:
            return None
        return offline_test_sh((task.tests_dir / "test.sh").read_text(encoding="utf-8"))

    def _check_offline_verifier(self, task: HarborTask, log: str, network: bool) -> None:
        """Raise ``VerifierError(kind="network")`` when the verifier failed to reach the
        internet: its low reward says nothing about the agent's work."""
        match = _NO_NETWORK_RE.search(log)
        if match is None:
            return
        start = log.rfind("\n", 0, match.start()) + 1
        end = log.find("\n", match.end())
        line = log[start : end if end >= 0 else len(log)].strip()
        if network and not self._bridge:
            why = (
                "its container was given a network, yet the Docker daemon has no bridge "
                "network (dockerd --bridge=none, as on this machine), so containers get only "
                "loopback (run the daemon with a bridge to give them the internet)"
            )
        elif network:
            why = "its container was given a network but could not resolve or reach the host"
        elif not verifier_environment(task).wants_network:
            table = "[verifier.environment]" if task.config.verifier.separate else "task"
            why = f"its container has none: the {table}'s network_mode is 'no-network'"
        else:
            why = (
                "its container has none: the run grants none "
                "(pass --allow-network, HarborAdapter(allow_network=True))"
            )
        hint = ""
        if not self.runtime.images.build.provision_verifier and offline_test_sh(
            (task.tests_dir / "test.sh").read_text(encoding="utf-8")
        ):
            hint = (
                "; its test.sh has the uv/uvx shape that --build-network --provision-verifier "
                "fetches at build time (HarborAdapter(provision_verifier=True))"
            )
        raise VerifierError(
            f"the verifier of {task.name!r} needs the internet but {why}; "
            f"it printed: {line[:300]!r}{hint}",
            kind="network",
            path="/tests/test.sh",
        )

    async def resume_from_image(self, image: str, state: State) -> State:
        """Continue ``state`` in a new container started from ``image``, a commit of an episode
        at ``state`` (the caller vouches for that); a new episode id, a fresh shell."""
        self._ensure_open()
        start = await self._start(state.task, seed=state.seed, image=image)
        if isinstance(state.hidden, Mapping) and self._require_task().steps:
            self._step_index = int(state.hidden.get("step_index", 0))
            self._step_results = [dict(r) for r in state.hidden.get("step_results", [])]
            self._restart_budget()
        resumed = replace(state, episode_id=start.episode_id, hidden=self._hidden())
        self._current = resumed
        return resumed

    async def resume_from_checkpoint(self, checkpoint: SandboxCheckpoint, state: State) -> State:
        """Continue ``state`` in a gVisor sandbox restored from ``checkpoint`` (taken of an
        episode at ``state``): processes and the shell as they were; a new episode id."""
        self._ensure_open()
        start = await self._start(state.task, seed=state.seed, image=None, checkpoint=checkpoint)
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
        checkpoint: SandboxCheckpoint | None = None,
    ) -> State:
        """Start the task's container (from ``image`` if given, else the task image; from
        ``checkpoint``: restore that gVisor sandbox)."""
        try:
            index, harbor_task = self.dataset.resolve(task)
        except (KeyError, IndexError, ValueError) as exc:
            raise EnvError(str(exc).strip("'\"")) from exc
        env_cfg = harbor_task.config.environment
        if env_cfg.gpus:
            raise EnvError(f"task {harbor_task.name!r} needs {env_cfg.gpus} GPU(s); none offered")
        await self._drop_container()
        engine = await self._get_engine()
        if checkpoint is None:
            image = image or await self.runtime.images.ensure(engine, harbor_task)
        else:
            image = checkpoint.spec.image
        network = self.runtime.allow_network and env_cfg.wants_network
        self._network = network
        self._bridge = network and await _daemon_has_bridge(engine)
        agent_user = harbor_task.config.agent.user
        compose = harbor_task.compose
        spec = ContainerSpec(
            image=image,
            env={
                **resolve_env(env_cfg.env, harbor_task.name),
                **(compose.main.environment if compose else {}),
            },
            extra_hosts=extra_hosts(compose) if compose else (),
            workdir=env_cfg.workdir,
            user=None if agent_user is None else str(agent_user),
            network_mode="bridge" if network else "none",
            memory_bytes=env_cfg.memory_mb * _MIB,
            cpus=env_cfg.cpus,
            labels={TASK_IMAGE_LABEL: harbor_task.name, DATASET_LABEL: self.dataset.spec},
        )
        if checkpoint is not None or self.runtime.container_runtime == "gvisor":
            _check_gvisor_task(harbor_task, keep_artifacts=self.runtime.artifacts_dir is not None)
            await self._start_sandbox(engine, spec, checkpoint)
            container = self._container
            assert container is not None
        elif self.runtime.pool is not None:  # started, shell open: no create on this path
            warm = await self.runtime.pool.take(spec)
            container, self._shell = warm.container, warm.shell
            self._container = container
        else:
            container = await Container.create(engine, spec)
            self._container = container
            self._shell = await container.shell()
        if compose is not None and compose.sidecars:
            try:
                self._sidecars = await start_sidecars(
                    engine, self.runtime.images, harbor_task, self._docker_container(),
                    memory_bytes=spec.memory_bytes, cpus=spec.cpus,
                )  # fmt: skip
            except BaseException:
                await self._drop_container()  # no half-made pod outlives a failed reset
                raise
        details = await container.inspect()
        self._workdir = env_cfg.workdir or (details.get("Config") or {}).get("WorkingDir") or "/"
        self._task, self._task_index = harbor_task, index
        self._step_index, self._step_results = 0, []
        self._restart_budget()
        if harbor_task.steps and image is None:  # a resumed commit is past its setup
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

    async def _start_sandbox(
        self, engine: DockerEngine, spec: ContainerSpec, checkpoint: SandboxCheckpoint | None
    ) -> None:
        """A gVisor sandbox with its shell: new, or restored from ``checkpoint``."""
        from ...sandbox.fork import resume_sandbox
        from ...sandbox.sandbox import Sandbox

        if checkpoint is not None:
            self._container, self._shell = await resume_sandbox(checkpoint, engine.labels)
            return
        if self._network:
            raise EnvError("the gVisor runtime runs sandboxes without a network (--network=none)")
        sandbox = await Sandbox.create(engine, spec)
        self._container = sandbox
        self._shell = await sandbox.shell()

    async def _run_command(self, command: str) -> tuple[CommandResult, float]:
        return await self._run(command)

    async def _verify_episode(self) -> tuple[float, Mapping[str, Any]]:
        verdict = await self.verify()
        task = self._require_task()
        if not task.steps:
            return verdict.reward, verdict.info()
        self._record_step(verdict)  # truncated mid-step: this step counts as verified
        strategy = task.config.multi_step_reward_strategy
        return multi_step.aggregate(strategy, self._step_results), {
            **verdict.info(),
            **self._step_info(),
        }

    async def _step(self, state: State, action: Action) -> StepResult:
        task = self._task
        if task is None or not task.steps or not self.is_submit(action):
            return await super()._step(state, action)
        return await self._submit_step(state, action, task)

    async def _submit_step(self, state: State, action: Action, task: HarborTask) -> StepResult:
        """A multi-step task's ``SUBMIT``: verify this step, then end the episode (last step,
        or a ``min_reward`` miss) or open the next step (see ``steps.py``)."""
        step, index = state.step + 1, self._step_index
        last = index == len(task.steps) - 1
        if self._replaying and last:
            raise RestoreError(
                f"the replayed prefix submits the last step at step {step}", step=step
            )
        verdict = await self.verify()
        self._record_step(verdict)
        info: dict[str, Any] = {
            "command": self.submit_keyword,
            "submitted": True,
            **verdict.info(),
            **self._step_info(),
        }
        passed = multi_step.passes(task.steps[index].config.min_reward, verdict)
        if last or not passed:
            if self._replaying:
                raise RestoreError(
                    f"the replayed step {task.steps[index].name!r} missed its min_reward at "
                    f"step {step} (reward {verdict.reward:g}): the replay diverged",
                    step=step,
                )
            info["multi_step_end"] = "completed" if last else "min_reward"
            strategy = task.config.multi_step_reward_strategy
            reward = multi_step.aggregate(strategy, self._step_results)
            text = SUBMITTED_TEXT
            if not last:
                text += (
                    f" Step {index + 1} of {len(task.steps)} fell short of its min_reward; "
                    "the episode ends."
                )
            return self._result(state, action, text, reward, info, terminated=True)
        self._step_index = index + 1
        await multi_step.enter_step(self, self._step_index)
        self._restart_budget()
        info["step_boundary"] = True
        text = multi_step.step_text(task, self._step_index, self.submit_keyword, self._workdir)
        return self._result(state, action, text, 0.0, info)

    def _record_step(self, verdict: VerifierResult) -> None:
        name = self._require_task().steps[self._step_index].name
        self._step_results.append(
            {"name": name, "reward": verdict.reward, "rewards": dict(verdict.rewards)}
        )

    def _step_info(self) -> dict[str, Any]:
        return {
            "verified_step": self._step_results[-1]["name"],
            "step_reward": self._step_results[-1]["reward"],
            "step_results": [dict(r) for r in self._step_results],
        }

    def _restart_budget(self) -> None:
        """The budget of the current step (multi-step) or episode: the agent timeout unless
        the environment was given one."""
        task = self._require_task()
        timeout = (
            task.steps[self._step_index].config.agent.timeout_sec
            if task.steps
            else task.config.agent.timeout_sec
        )
        override = self._budget_override
        self._budget_sec = timeout if override == "task" else override
        self._used_sec = 0.0

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
            engine, self._engine = self._engine, None
            if engine is not None and self.runtime.engine is None:
                await engine.aclose()
            if not self._verifying:  # else the verification still in flight releases it
                await self._release_engine()

    async def _release_engine(self) -> None:
        """Stop using the adapter's engine; the last environment to stop disconnects it."""
        users = self.runtime.engine_users
        if users is not None and id(self) in users:
            users.discard(id(self))
            if not users and self.runtime.engine is not None:
                await self.runtime.engine.disconnect()

    # -- internals --------------------------------------------------------------------------

    def _truncation(self, step: int) -> tuple[str, str] | None:
        """The time budget, then ``max_steps``; never while replaying a saved prefix."""
        if self._replaying:
            return None
        if self._budget_sec is not None and self._used_sec >= self._budget_sec:
            return (
                "agent_timeout",
                f"the trajectory time budget of {self._budget_sec:g}s is used up",
            )
        return super()._truncation(step)

    async def _run(self, command: str) -> tuple[CommandResult, float]:
        """Run an agent command; outside a replay its time is charged to the budget."""
        shell = self._require_shell()
        timeout = self.command_timeout_sec
        left = self.budget_left_sec
        if not self._replaying and left is not None:
            timeout = min(timeout, left)
        started = time.monotonic()
        result = await shell.run(command, timeout=timeout)
        if not self._replaying and self._budget_sec is not None:
            self._used_sec = min(self._budget_sec, self._used_sec + time.monotonic() - started)
            if result.timed_out and left is not None and timeout >= left:
                self._used_sec = self._budget_sec
        return result, timeout

    def _hidden(self) -> dict[str, Any]:
        task = self._require_task()
        left = self.budget_left_sec
        hidden: dict[str, Any] = {
            "task_name": task.name,
            "task_index": self._task_index,
            "dataset": self.dataset.spec,
            "budget_sec": self._budget_sec,
            "budget_used_sec": round(self._used_sec, 6),
            "budget_left_sec": None if left is None else round(left, 6),
        }
        if task.steps:
            hidden["step_index"] = self._step_index
            hidden["step_name"] = task.steps[self._step_index].name
            hidden["step_results"] = [dict(r) for r in self._step_results]
        return hidden

    def _initial_text(self, task: HarborTask) -> str:
        if task.steps:
            return multi_step.step_text(task, 0, self.submit_keyword, self._workdir)
        return (
            f"{task.instruction}\n\n"
            f"You are in a bash shell inside a Linux container, in {self._workdir}. Reply with "
            "one shell command per turn (plain text or a fenced code block); you will see its "
            f"output. When the task is done, reply with {self.submit_keyword} alone."
        )

    async def _get_engine(self) -> DockerEngine:
        if self.runtime.engine is not None:  # the adapter's: connected on first use
            if self.runtime.engine_users is not None:
                self.runtime.engine_users.add(id(self))
            return await self.runtime.engine.connect()
        if self._engine is None:
            self._engine = await DockerEngine(self.runtime.docker_url).connect()
        return self._engine

    def _track_verifier(self, container: Container | None) -> None:
        if container is not None and self.closed:
            raise ClosedError(f"{type(self).__name__} (closed during its verification)")
        self._verifier = container

    async def _drop_container(self) -> None:
        sidecars, self._sidecars = self._sidecars, None
        container, self._container, self._shell = self._container, None, None
        verifier, self._verifier = self._verifier, None
        try:
            if sidecars is not None:
                await sidecars.aclose()
            if verifier is not None:
                await verifier.aclose()
        finally:
            if container is not None:
                await container.aclose()

    def _docker_container(self) -> Container:
        """The agent's container where only a Docker one will do (archives, sidecars)."""
        container = self._require_container()
        if not isinstance(container, Container):
            raise EnvError("artifacts and sidecars need a Docker container (runtime='runc')")
        return container

    def _require_container(self) -> Container | Sandbox:
        if self._container is None:
            raise EnvError("HarborEnvironment has no container: call reset() first")
        return self._container

    def _require_shell(self) -> ShellSession:
        if self._shell is None:
            raise EnvError("HarborEnvironment has no shell: call reset() first")
        return self._shell

    def _require_task(self) -> HarborTask:
        if self._task is None:
            raise EnvError("HarborEnvironment has no task: call reset() first")
        return self._task


async def _daemon_has_bridge(engine: DockerEngine) -> bool:
    """Whether the daemon has its default ``bridge`` network (not under ``--bridge=none``)."""
    try:
        found = await engine.request_json(
            "GET", "networks", params={"filters": json.dumps({"name": ["bridge"]})}
        )
    except ContainerError:
        return True  # unknown: say nothing about the bridge
    return any(isinstance(n, dict) and n.get("Name") == "bridge" for n in found or [])


def _check_gvisor_task(task: HarborTask, *, keep_artifacts: bool) -> None:
    """Refuse what a gVisor sandbox cannot host yet: Docker sidecars joined to its network
    namespace, and artifacts copied out as tar archives (separate verifier, artifacts_dir)."""
    what = None
    if task.compose is not None and task.compose.sidecars:
        what = "compose sidecars (they join a Docker container's network namespace)"
    elif task.config.verifier.separate:
        what = "a separate verifier environment (its artifacts are copied out as an archive)"
    elif keep_artifacts:
        what = "artifacts_dir (artifacts are copied out as an archive)"
    if what is not None:
        raise EnvError(f"task {task.name!r}: runtime='gvisor' does not support {what}; use runc")
