"""Multi-step Harbor tasks (``[[steps]]``) as ONE episode in one shared container.

A step boundary is an observation carrying the next instruction: ``SUBMIT`` ends the
current step, its verifier runs (``tests/`` with the step's own ``tests/`` on top, its
``[steps.verifier]``), and unless that was the last step or its reward misses the step's
``min_reward``, the next step's ``workdir/`` is copied into the working directory, its
``workdir/setup.sh`` runs (as root; a non-zero exit is an ``EnvError``), and the next
observation is the next step's instruction (a non-terminal transition, reward 0.0). The
terminal transition carries the task's reward, ``multi_step_reward_strategy``: ``"mean"``
of the verified steps' rewards (Harbor: steps that produced a result), or the ``"final"``
verified step's. ``max_steps`` counts actions over the whole episode; the time budget is
per step (``[steps.agent].timeout_sec``, else ``[agent]``'s) and restarts at a boundary;
running out (or ``max_steps``) truncates the episode, the current step verified.

States record where they are: ``state.hidden`` holds ``step_index``, ``step_name`` and
the ``step_results`` so far, so a saved state is an ordinary state. ``harbor_restore``
replays its actions, and replaying a boundary's ``SUBMIT`` re-runs that boundary (the
step's verifier, then the next step's ``setup.sh``), so the container is where the
original episode was; a replayed boundary that would end the episode is a
``RestoreError``. The oracle (``oracle_actions``) runs each step's ``solution/solve.sh``
in turn, each followed by ``SUBMIT``. Starting mid-task works both ways: Harbor's
(``start_at_step``: replay the earlier steps' oracle solutions) and ours (any saved state,
restored with ``harbor_restore``).
"""

from __future__ import annotations

import io
import math
import tarfile
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ....docker.runtime import RuntimeHost
from ....errors import EnvError, RestoreError
from ....shell_task import SUBMITTED_TEXT, StepReply
from ....types import Action, Observation, State, StepResult
from ..tasks.config import VerifierConfig
from ..tasks.task import HarborTask, TaskStep
from ..verify.verifier import VerifierResult

if TYPE_CHECKING:
    from ..tasks.dataset import HarborDataset

__all__ = [
    "STEP_SETUP_PATH",
    "StepEpisode",
    "agent_timeout",
    "aggregate",
    "enter_step",
    "final_verdict",
    "oracle_actions",
    "passes",
    "start_at_step",
    "step_index",
    "step_text",
    "submit_step",
    "tests_dirs",
    "verifier_config",
]

STEP_SETUP_PATH = "/tmp/.llenvs-step-setup.sh"
_SETUP_TIMEOUT_SEC = 600.0


class StepEpisode(Protocol):
    """What the step machinery drives: ``HarborEnvironment`` (typed here so that this module
    does not import the environment that uses it)."""

    dataset: HarborDataset
    submit_keyword: str
    _step_index: int
    _step_results: list[dict[str, Any]]
    _replaying: bool

    @property
    def task(self) -> HarborTask | None: ...

    @property
    def container(self) -> RuntimeHost | None: ...

    @property
    def workdir(self) -> str: ...

    def replaying(self) -> AbstractContextManager[None]: ...

    async def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State: ...

    async def step(self, state: State, action: Action) -> StepResult: ...

    async def verify(self) -> VerifierResult: ...

    def _restart_budget(self) -> None: ...

    def _submit_reply(self, state: State, action: Action, text: str) -> StepReply: ...

    def _result(
        self,
        state: State,
        action: Action,
        observation: Observation | str,
        reward: float,
        info: Mapping[str, Any],
        *,
        terminated: bool = False,
    ) -> StepResult: ...


def passes(min_reward: float | Mapping[str, float] | None, verdict: VerifierResult) -> bool:
    """A number gates the step's reward; a mapping gates named keys (missing keys fail)."""
    if min_reward is None:
        return True
    if isinstance(min_reward, Mapping):
        return all(verdict.rewards.get(k, -math.inf) >= v for k, v in min_reward.items())
    return verdict.reward >= min_reward


def aggregate(strategy: str, results: Sequence[Mapping[str, Any]]) -> float:
    """The episode's reward from the verified steps' results (0.0 when none was verified)."""
    if not results:
        return 0.0
    if strategy == "final":
        return float(results[-1]["reward"])
    return math.fsum(float(r["reward"]) for r in results) / len(results)


def verifier_config(task: HarborTask, index: int) -> VerifierConfig:
    """Step ``index``'s ``[steps.verifier]`` (the task's as fallback), else ``[verifier]``."""
    return task.steps[index].config.verifier if task.steps else task.config.verifier


def agent_timeout(task: HarborTask, index: int) -> float | None:
    """Step ``index``'s agent time budget (``[steps.agent]``, else ``[agent]``)."""
    agent = task.steps[index].config.agent if task.steps else task.config.agent
    return agent.timeout_sec


def tests_dirs(task: HarborTask, index: int) -> list[Path]:
    """``tests/`` then step ``index``'s own ``tests/`` (its files win), as Harbor does."""
    dirs = [task.tests_dir] if task.tests_dir.is_dir() else []
    if task.steps and (own := task.steps[index].tests_dir) is not None:
        dirs.append(own)
    return dirs


def step_text(task: HarborTask, index: int, submit: str, workdir: str) -> str:
    """The observation that opens step ``index``: its instruction and how to end it."""
    step = task.steps[index]
    done = f"Step {index} of {len(task.steps)} is submitted. " if index else ""
    return (
        f"{done}Step {index + 1} of {len(task.steps)} ({step.name}):\n\n{step.instruction}\n\n"
        f"You are in a bash shell inside a Linux container, in {workdir}. Reply with one shell "
        "command per turn (plain text or a fenced code block); you will see its output. When "
        f"this step is done, reply with {submit} alone."
    )


def _workdir_tar(step: TaskStep, workdir: str) -> bytes | None:
    """``steps/<name>/workdir/`` minus the reserved ``setup.sh``, rooted at ``workdir``."""
    source = step.workdir_dir
    if source is None:
        return None
    buf = io.BytesIO()
    root = workdir.strip("/")
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source).as_posix()
            if relative == "setup.sh":
                continue
            info = tar.gettarinfo(str(path), arcname=f"{root}/{relative}".lstrip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    return buf.getvalue()


async def enter_step(env: StepEpisode, index: int) -> None:
    """Stage step ``index``: copy its ``workdir/`` into the working directory and run its
    ``workdir/setup.sh`` there (as root); a failing setup is an ``EnvError``."""
    task, container = env.task, env.container
    assert task is not None and container is not None
    step = task.steps[index]
    files = _workdir_tar(step, env.workdir)
    if files is not None:
        await container.put_archive("/", files)
    setup = step.workdir_dir / "setup.sh" if step.workdir_dir is not None else None
    if setup is None or not setup.is_file():
        return
    await container.put_file(STEP_SETUP_PATH, setup.read_bytes(), mode=0o755)
    run = await container.exec(
        ["bash", "-c", f"bash {STEP_SETUP_PATH}; code=$?; rm -f {STEP_SETUP_PATH}; exit $code"],
        timeout=_SETUP_TIMEOUT_SEC,
        workdir=env.workdir,
        user="0",
    )
    if run.exit_code != 0 or run.timed_out:
        why = "timed out" if run.timed_out else f"exited with {run.exit_code}"
        raise EnvError(
            f"step {index} {step.name!r} of task {task.name!r}: workdir/setup.sh {why}: "
            f"{run.output.strip()[-500:]!r}"
        )


def _record(env: StepEpisode, task: HarborTask, verdict: VerifierResult) -> dict[str, Any]:
    """Add the current step's verdict to the episode's step results; the info keys that say so."""
    name = task.steps[env._step_index].name
    results = env._step_results
    results.append({"name": name, "reward": verdict.reward, "rewards": dict(verdict.rewards)})
    return {
        "verified_step": name,
        "step_reward": verdict.reward,
        "step_results": [dict(r) for r in results],
    }


def final_verdict(
    env: StepEpisode, task: HarborTask, verdict: VerifierResult
) -> tuple[float, dict[str, Any]]:
    """The episode's reward and info once it ends with ``verdict`` of the current step."""
    info = {**verdict.info(), **_record(env, task, verdict)}
    return aggregate(task.config.multi_step_reward_strategy, env._step_results), info


async def submit_step(
    env: StepEpisode, state: State, action: Action, task: HarborTask
) -> StepResult:
    """A multi-step task's ``SUBMIT``: verify this step, then end the episode (last step,
    or a ``min_reward`` miss) or open the next step."""
    step, index = state.step + 1, env._step_index
    last = index == len(task.steps) - 1
    if env._replaying and last:
        raise RestoreError(f"the replayed prefix submits the last step at step {step}", step=step)
    verdict = await env.verify()
    reward, info = final_verdict(env, task, verdict)
    info = {"command": env.submit_keyword, "submitted": True, **info}
    if last or not passes(task.steps[index].config.min_reward, verdict):
        if env._replaying:
            raise RestoreError(
                f"the replayed step {task.steps[index].name!r} missed its min_reward at "
                f"step {step} (reward {verdict.reward:g}): the replay diverged",
                step=step,
            )
        info["multi_step_end"] = "completed" if last else "min_reward"
        text = SUBMITTED_TEXT
        if not last:
            text += (
                f" Step {index + 1} of {len(task.steps)} fell short of its min_reward; "
                "the episode ends."
            )
        reply = env._submit_reply(state, action, text)
        info.update(reply.info)
        return env._result(state, action, reply.observation, reward, info, terminated=True)
    env._step_index = index + 1
    await enter_step(env, env._step_index)
    env._restart_budget()
    info["step_boundary"] = True
    text = step_text(task, env._step_index, env.submit_keyword, env.workdir)
    reply = env._submit_reply(state, action, text)
    info.update(reply.info)
    return env._result(state, action, reply.observation, 0.0, info)


def oracle_actions(task: HarborTask, submit: str = "SUBMIT") -> tuple[str, ...]:
    """Harbor's oracle as actions: ``solve.sh`` whole (one action); for a multi-step task
    each step's ``solution/solve.sh`` in turn with ``submit`` between steps (a step
    without a solution is submitted as it is). The final ``submit`` is the policy's."""
    if not task.steps:
        return (task.oracle_command(),)
    actions: list[str] = []
    for index, step in enumerate(task.steps):
        if step.solution_dir is not None:
            actions.append(task.oracle_command(step.solution_dir))
        if index < len(task.steps) - 1:
            actions.append(submit)
    return tuple(actions)


def step_index(task: HarborTask, step: int | str) -> int:
    """A step given by index or name."""
    names = [s.name for s in task.steps]
    if isinstance(step, str):
        if step not in names:
            raise EnvError(f"task {task.name!r} has no step {step!r} (steps: {names})")
        return names.index(step)
    if not 0 <= step < len(names):
        raise EnvError(f"task {task.name!r} has {len(names)} steps; no step index {step}")
    return step


async def start_at_step(
    env: StepEpisode, task: int | str, step: int | str, *, seed: int | None = None
) -> State:
    """Harbor's way into the middle of a task: reset, then replay the earlier steps' oracle
    solutions (each boundary verified and staged as in an episode, no budget charged);
    returns the state at the start of ``step`` (an ordinary, restorable state)."""
    _, harbor_task = env.dataset.resolve(task)
    if not harbor_task.steps:
        raise EnvError(f"task {harbor_task.name!r} is not a multi-step task")
    target = step_index(harbor_task, step)
    submit = env.submit_keyword
    actions: list[str] = []
    for index, each in enumerate(harbor_task.steps[:target]):
        if each.solution_dir is None:
            raise EnvError(
                f"task {harbor_task.name!r}: step {index} {each.name!r} has no "
                "solution/solve.sh to replay"
            )
        actions += [harbor_task.oracle_command(each.solution_dir), submit]
    with env.replaying():
        state = await env.reset(task, seed=seed)
        for command in actions:
            state = (await env.step(state, Action(text=command))).next_state
    return replace(state, info={**state.info, "started_at_step": harbor_task.steps[target].name})
