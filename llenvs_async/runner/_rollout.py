"""One rollout's mutable bookkeeping inside the lockstep loop, and how it becomes a Trajectory."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import _timing
from ..env import Environment, Placed, new_episode_id
from ..errors import EnvError
from ..types import (
    Action,
    ChatMessage,
    Completion,
    ErrorInfo,
    GenerationRequest,
    Observation,
    State,
    StopReason,
    TokenStep,
    Trajectory,
    Transition,
)

__all__ = [
    "PromptBuilder",
    "Rollout",
    "RolloutInput",
    "assistant_message",
    "conversation",
    "is_programming_error",
    "observation_messages",
    "request_seed",
    "with_saved_history",
]

PromptBuilder = Callable[[State, Sequence[Transition]], Sequence[ChatMessage]]
"""``(initial_state, transitions) -> messages``: replaces the default conversation.

``initial_state.history`` is the path that led to the start state (what the policy saw
before this rollout); the current state's ``history`` is the whole path. A transition's
``info`` here is the environment's: ``generate_sec``/``step_sec`` join it in the trajectory.
"""

# Errors that mean the caller's code is wrong: they propagate instead of being recorded.
PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    NameError,
    AssertionError,
    NotImplementedError,
    ImportError,
)


def is_programming_error(exc: BaseException) -> bool:
    """A programming error, or an exception group (from a TaskGroup inside an environment,
    backend or restore function) that holds one: either must propagate, not be recorded.
    """
    if isinstance(exc, PROGRAMMING_ERRORS):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(PROGRAMMING_ERRORS) is not None


def request_seed(
    base_seed: int | None, task: int | str | None, rollout_id: int, step: int
) -> int | None:
    """The sampling seed of rollout ``rollout_id`` of ``task`` at ``step``: a stable hash of
    the four, so rollouts from one state are independent samples and a rerun (or a resumed
    run) with the same base seed reproduces them. ``None`` (no base seed) leaves sampling
    to the engine.
    """
    if base_seed is None:
        return None
    key = f"{base_seed}:{task!r}:{rollout_id}:{step}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF_FFFF_FFFF  # fits a signed int64


def conversation(state: State, keep_reasoning: bool = False) -> list[ChatMessage]:
    """What the policy saw up to ``state``: ``user`` = the initial observation, then per
    step the assistant turn (the action as the environment recorded it) and the
    observation's turns. Without a complete history (a state built from a bare action
    tuple) only its observation is known.
    """
    history = state.history
    if not history.complete or len(history) != len(state.actions):
        return [ChatMessage(role="user", content=state.observation.text)]
    assert history.initial is not None
    messages = [ChatMessage(role="user", content=history.initial.text)]
    for step in history:
        assert step.observation is not None
        messages.append(assistant_message(step.action, step.observation, keep_reasoning))
        messages.extend(observation_messages(step.observation))
    return messages


def assistant_message(
    action: Action, observation: Observation | None = None, keep_reasoning: bool = False
) -> ChatMessage:
    """The assistant turn of ``action``, as the environment shows it when it says so in the
    observation that followed (``data["shown_action"]``: a command written by hand, in the
    shape of the environment's action format); its reasoning only when kept."""
    turn = None if observation is None else observation.data.get("shown_action")
    if isinstance(turn, Mapping):
        calls = tuple(turn.get("tool_calls") or ())
        return ChatMessage(role="assistant", content=str(turn.get("content", "")), tool_calls=calls)
    completion = action.completion
    reasoning = completion.reasoning if keep_reasoning and completion is not None else None
    return ChatMessage(
        role="assistant", content=action.text, tool_calls=action.tool_calls, reasoning=reasoning
    )


def observation_messages(observation: Observation) -> list[ChatMessage]:
    """One ``tool`` message per reply when the observation answers tool calls
    (``tool_replies``, in call order), else one ``user`` message."""
    if observation.tool_replies:
        return [
            ChatMessage(role="tool", content=r.content, tool_call_id=r.tool_call_id)
            for r in observation.tool_replies
        ]
    return [ChatMessage(role="user", content=observation.text)]


def with_saved_history(restored: State, saved: State) -> State:
    """``restored`` carrying ``saved``'s history: a replay re-executes the actions, but
    the context the policy had is what it originally saw (same actions, same step).
    """
    if restored.actions is saved.actions or restored.step != saved.step:
        return restored
    if restored.actions != saved.actions:
        return restored
    return replace(restored, actions=saved.actions)


@dataclass(frozen=True, slots=True)
class RolloutInput:
    """What one rollout starts from: a task to reset to, or a saved state to restore.
    ``index`` is its position in the run; ``rollout_id`` (default: ``index``) is what its
    seeds follow, so a caller that resumes a run keeps each rollout's own draws. ``prefix``:
    the steps this rollout already took (a resumed one; ``state`` is where they led): its
    trajectory starts with them and ``max_steps`` counts them."""

    index: int
    task: int | str | None = None
    seed: int | None = None
    state: State | None = None
    forced_action: Action | None = None
    rollout_id: int | None = None
    prefix: tuple[Transition, ...] = ()

    @property
    def seed_id(self) -> int:
        """The id this rollout's sampling seeds and scripted draws follow."""
        return self.index if self.rollout_id is None else self.rollout_id


_STEP = 6  # entries a step keeps in ``Rollout.steps``: the fields of its Transition but tokens


@dataclass(slots=True, eq=False)
class Rollout:
    """A live rollout. ``messages`` grows by a step's turns as it goes and is the request's
    own tuple (one copy of the conversation's pointers, not a list and a tuple of them);
    ``steps`` holds each step's Transition fields flat, ``times`` its generate and step
    durations: the Transitions are made when the trajectory is (see ``timed``)."""

    spec: RolloutInput
    env: Environment | None = None
    owns_env: bool = False
    initial_state: State | None = None
    state: State | None = None
    steps: list[Any] = field(default_factory=list)
    step_tokens: list[TokenStep | None] | None = None  # token mode: each step's ids
    messages: tuple[ChatMessage, ...] = ()
    pending_action: Action | None = None
    pending_completion: Completion | None = None
    steps_left: int | None = None
    error: ErrorInfo | None = None
    stop_reason: StopReason = "unfinished"
    # Token mode: the prompt the next request sends.
    prompt_ids: tuple[int, ...] | None = None
    info: dict[str, Any] | None = None  # the trajectory's other info, made when first noted
    end_reward: float = 0.0  # a verified stop's reward when no step carries it
    creating: bool = False  # inside the factory call (teardown lets it finish first)
    # Timing (monotonic ``_timing.clock()``): when preparation began (and its wall-clock time,
    # ``started_at``), when the rollout last became ready to ask for an action, and how long
    # the pending action took to generate. Slots, not the info dict: one per rollout is live.
    began: float | None = None
    started: float = 0.0
    restore_sec: float | None = None  # how long the reset or restore took
    asked: float = 0.0
    generate_sec: float | None = None
    times: array[float] = field(default_factory=lambda: array("d"))
    handed: int = 0  # steps given to the run's ``on_step`` as they now are (see ``hand_steps``)

    @property
    def length(self) -> int:
        """How many steps were taken."""
        return len(self.steps) // _STEP

    @property
    def transitions(self) -> tuple[Transition, ...]:
        """The steps so far (made on each call; their info lacks the timing)."""
        return tuple(self.step(i) for i in range(self.length))

    def step(self, index: int, *, timed: bool = False) -> Transition:
        """Step ``index`` (negative: from the end) as a Transition; ``timed``: its info
        also holds the step's durations."""
        i = index + self.length if index < 0 else index
        state, action, next_state, reward, completion, info = self.steps[
            i * _STEP : (i + 1) * _STEP
        ]
        return Transition(
            state=state,
            action=action,
            next_state=next_state,
            reward=reward,
            completion=completion,
            info=_timing.step_info(self.times, i, info) if timed else info,
            tokens=None if self.step_tokens is None else self.step_tokens[i],
        )

    def set_last(self, t: Transition) -> None:
        """Replace the last step with ``t``."""
        self.steps[-_STEP:] = (t.state, t.action, t.next_state, t.reward, t.completion, t.info)
        if t.tokens is not None and self.step_tokens is None:
            self.step_tokens = [None] * self.length
        if self.step_tokens is not None:
            self.step_tokens[-1] = t.tokens
        self.handed = min(self.handed, self.length - 1)  # changed: handed again

    @property
    def finished(self) -> bool:
        return self.stop_reason != "unfinished"

    def note_env(self, env: Environment) -> None:
        """Record where the instance runs (a remote one's ``node_id``) in the trajectory's info."""
        node = env.node_id if isinstance(env, Placed) else None
        if node is not None:
            self.note("node_id", node)

    def note(self, key: str, value: Any) -> None:
        """Set ``key`` in the trajectory's info."""
        if self.info is None:
            self.info = {}
        self.info[key] = value

    def begin(self) -> None:
        """Preparation starts: the rollout's clock (``started_at``, ``wall_sec``) starts."""
        self.began, self.started = _timing.clock(), _timing.time()

    def start(
        self,
        state: State,
        preamble: Sequence[ChatMessage],
        steps_left: int | None,
        env_max_steps: int | None,
        keep_reasoning: bool = False,
    ) -> None:
        self.initial_state = self.state = state
        self.pending_action = self.spec.forced_action
        self.asked = _timing.clock()
        self.steps_left = steps_left
        self.messages = (*self.messages, *preamble, *conversation(state, keep_reasoning))
        if self.spec.prefix:
            self._take_prefix(self.spec.prefix)
        if self.pending_action is not None and state.done:
            # Dropping the forced action would return an empty trajectory that looks like a
            # clean Q(s, a) sample of 0 although ``a`` was never taken.
            self.pending_action = None
            self.fail(
                EnvError(
                    f"cannot apply the forced action {self.spec.forced_action!r}: the start "
                    f"state (episode {state.episode_id!r}, step {state.step}) is already "
                    f"{'terminated' if state.terminated else 'truncated'}"
                ),
                "step",
            )
            return
        self.check_stop(env_max_steps)

    def _take_prefix(self, prefix: tuple[Transition, ...]) -> None:
        """Start a resumed rollout with the steps it already took: its trajectory begins
        with them (their info keeps the durations they were recorded with), its step budget
        counts them."""
        self.initial_state = prefix[0].state
        for t in prefix:
            self.steps += (t.state, t.action, t.next_state, t.reward, t.completion, t.info)
            _timing.record(self.times, None, 0.0)
        if any(t.tokens is not None for t in prefix):
            self.step_tokens = [t.tokens for t in prefix]
        if self.steps_left is not None:
            self.steps_left -= len(prefix)
        self.handed = len(prefix)
        self.note("resumed_at_step", len(prefix))

    def request(
        self,
        builder: PromptBuilder | None,
        base_seed: int | None,
        tools: tuple[Mapping[str, Any], ...] = (),
        tool_choice: str | Mapping[str, Any] | None = None,
    ) -> GenerationRequest:
        assert self.state is not None and self.initial_state is not None
        if builder is None:
            messages = self.messages
        else:
            messages = tuple(builder(self.initial_state, self.transitions))
        return GenerationRequest(
            messages=messages,
            prompt_token_ids=self.prompt_ids,
            rollout_index=self.spec.seed_id,
            step=self.state.step,
            task=self.state.task,
            seed=request_seed(base_seed, self.state.task, self.spec.seed_id, self.state.step),
            tools=tools,
            tool_choice=tool_choice if tools else None,
        )

    def record(
        self,
        transition: Transition,
        *,
        generate_sec: float | None,
        step_sec: float,
        ended: bool,
        cut: bool,
        env_max_steps: int | None,
        keep_reasoning: bool = False,
    ) -> None:
        """Append a step; ``ended``/``cut`` are the StepResult's terminated/truncated flags.
        The assistant turn is the action as the environment shows it. The step's durations
        go to ``times``: its info gets them when the trajectory is made (see ``timed``)."""
        t = transition
        self.steps += (t.state, t.action, t.next_state, t.reward, t.completion, t.info)
        if t.tokens is not None and self.step_tokens is None:
            self.step_tokens = [None] * (self.length - 1)
        if self.step_tokens is not None:
            self.step_tokens.append(t.tokens)
        _timing.record(self.times, generate_sec, step_sec)
        self.state = transition.next_state
        observation = self.state.observation
        self.messages = (
            *self.messages,
            assistant_message(transition.action, observation, keep_reasoning),
            *observation_messages(observation),
        )
        if self.steps_left is not None:
            self.steps_left -= 1
        self.check_stop(env_max_steps, ended=ended, cut=cut)

    def check_stop(
        self, env_max_steps: int | None, *, ended: bool = False, cut: bool = False
    ) -> None:
        state = self.state
        assert state is not None
        if ended or state.terminated:
            self.stop_reason = "terminated"
        elif cut or state.truncated or (env_max_steps is not None and state.step >= env_max_steps):
            self.stop_reason = "truncated"
        elif self.steps_left is not None and self.steps_left <= 0:
            self.stop_reason = "max_steps"

    def conclude(self, reward: float, info: Mapping[str, Any]) -> None:
        """Fold the verdict of a stop the runner made into the last step, which now ends
        the episode (truncated); with no step, the trajectory's ``end_reward``."""
        if not self.steps:
            self.end_reward = reward
            self.note("end_verdict", dict(info))
            return
        last = self.step(-1)
        next_state = replace(last.next_state, truncated=True)
        self.set_last(
            replace(
                last, reward=last.reward + reward, info={**last.info, **info}, next_state=next_state
            )
        )
        self.state = next_state

    def fail(self, exc: BaseException, phase: str) -> None:
        self.error = ErrorInfo.from_exception(exc, phase=phase)
        self.stop_reason = "error"

    def timed(self) -> tuple[Transition, ...]:
        """The Transitions, each info also holding the step's ``generate_sec`` and
        ``step_sec``: a live rollout keeps a step as its fields' pointers and two doubles,
        not as a Transition, a mapping and two floats (a third of its memory at T=10)."""
        return tuple(self.step(i, timed=True) for i in range(self.length))

    def trajectory(self) -> Trajectory:
        initial = self.initial_state
        if initial is None:  # failed before reset/restore produced a state
            initial = self.spec.state or State(
                observation=Observation(text=""), task=self.spec.task, seed=self.spec.seed
            )
        info: dict[str, Any] = {}
        if self.began is not None:
            info["started_at"] = _timing.utc_at(self.started)
        if self.restore_sec is not None:
            info["restore_sec"] = self.restore_sec
        info.update(self.info or ())
        if self.began is not None:
            info["wall_sec"] = _timing.seconds(_timing.clock() - self.began)
        return Trajectory(
            episode_id=new_episode_id(),  # made at the end: a live rollout does not need it
            initial_state=initial,
            transitions=self.timed(),
            error=self.error,
            index=self.spec.index,
            stop_reason=self.stop_reason,
            info=info,
            end_reward=self.end_reward,
        )
