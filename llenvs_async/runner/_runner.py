"""TrajectoryRunner: the public entry point for batches of rollouts."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .._resource import AsyncResource
from ..backends.base import Backend
from ..env import AgentSurface, EnvFactory, Environment, RestoreFn, replay_restore
from ..errors import ClosedError
from ..types import Action, ChatMessage, SamplingParams, State, Trajectory, Transition
from ._async import run_async
from ._config import COALESCE_WINDOW, RunConfig, RunnerStats, StepHook
from ._lockstep import SCHEDULES, Schedule, run_rollouts
from ._rollout import PromptBuilder, RolloutInput
from ._slots import Slots
from ._source import InputSource, SpecSource
from ._stream import RolloutStream, StreamInput
from ._tokens import TokenPrompts, check_token_backend

__all__ = ["TrajectoryRunner"]


class TrajectoryRunner(AsyncResource):
    """Runs batches of rollouts: in lockstep (``schedule="refill"``/``"chunks"``: one
    batched ``generate`` per round, then all environment steps concurrently) or without a
    round barrier (``"async"``: coalesced generate calls, see ``runner._async``).

    Non-pure environments with an ``env_factory`` get one fresh instance per rollout,
    restored with ``restore_fn`` (default ``replay_restore``); pure environments serve
    every rollout from ``environment``. ``batch_size`` caps live instances; a failed
    rollout is returned with ``error`` set, never dropped. Safe to call concurrently.

    The runner does not own ``environment`` or ``backend``. Used as an async context
    manager (or via ``aclose()``) it closes what it does own: a ``restore_fn`` that
    holds resources (e.g. snapshot images) and has an ``aclose``.

    ``token_mode=True`` keeps each rollout's prompt as token ids (see ``runner._tokens``):
    next prompt = previous prompt + sampled ids + templated observation turn, sent as
    ``prompt_token_ids``; ``chat_template_kwargs`` go to the tokenizer's chat template.
    ``tools`` (OpenAI-format tool definitions) go on every request (with ``tool_choice``);
    a completion's tool calls become ``Action.tool_calls``. By default the tools and the
    system prompt are what the environment offers (a shell task's action format: its
    ``tools`` and ``system_prompt``); ``system_prompt=""`` sends none. ``keep_reasoning``:
    chat mode re-sends earlier turns with their reasoning (default: without, as Qwen3's
    template does); token mode keeps every sampled id whatever this says.
    """

    def __init__(
        self,
        environment: Environment,
        backend: Backend,
        sampling_params: SamplingParams | None = None,
        *,
        env_factory: EnvFactory | None = None,
        restore_fn: RestoreFn | None = None,
        system_prompt: str | None = None,
        max_steps: int | None = None,
        step_timeout: float | None = None,
        restore_timeout: float | None = None,
        close_timeout: float = 30.0,
        prompt_builder: PromptBuilder | None = None,
        schedule: Schedule = "refill",
        instance_limit: int | None = None,
        token_mode: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        keep_reasoning: bool = False,
        coalesce_window: float = COALESCE_WINDOW,
    ) -> None:
        if not hasattr(environment, "step") or not hasattr(environment, "reset"):
            raise TypeError(
                "environment must implement the Environment protocol, "
                f"got {type(environment).__name__}"
            )
        if not callable(getattr(backend, "generate", None)):
            raise TypeError(f"backend must have an async generate(), got {type(backend).__name__}")
        if env_factory is not None and not callable(env_factory):
            raise TypeError(f"env_factory must be an async callable, got {env_factory!r}")
        _check_positive("max_steps", max_steps)
        _check_positive("step_timeout", step_timeout)
        _check_positive("restore_timeout", restore_timeout)
        _check_positive("close_timeout", close_timeout)
        _check_schedule(schedule)
        _check_positive("instance_limit", instance_limit)
        if isinstance(coalesce_window, bool) or not isinstance(coalesce_window, int | float):
            raise TypeError(f"coalesce_window must be a number, got {coalesce_window!r}")
        if coalesce_window < 0:
            raise ValueError(f"coalesce_window must be >= 0 seconds, got {coalesce_window!r}")
        self.coalesce_window = float(coalesce_window)
        offer = AgentSurface.of(environment)
        self.tools = _check_tools(offer.tools if tools is None else tools)
        self.tool_choice = tool_choice
        self.keep_reasoning = keep_reasoning
        self.tokens: TokenPrompts | None = None
        if token_mode:
            if prompt_builder is not None:
                raise ValueError(
                    "token_mode=True keeps prompts as token ids; a prompt_builder (messages) "
                    "cannot be combined with it"
                )
            self.tokens = TokenPrompts(
                check_token_backend(backend), chat_template_kwargs or {}, self.tools
            )
        elif chat_template_kwargs:
            raise ValueError("chat_template_kwargs is used by token_mode=True only")
        self.environment = environment
        self.backend = backend
        self.sampling_params = _with_stops(
            sampling_params or SamplingParams(), offer.stop_sequences
        )
        self.env_factory = env_factory
        self.restore_fn: RestoreFn = restore_fn or replay_restore
        self.system_prompt = offer.system_prompt if system_prompt is None else system_prompt
        # The format's example turns go with its system prompt; system_prompt="" sends neither.
        self.example_turns: tuple[ChatMessage, ...] = (
            offer.example_turns if system_prompt != "" else ()
        )
        self.max_steps = max_steps
        self.step_timeout = step_timeout
        self.restore_timeout = restore_timeout
        self.close_timeout = close_timeout
        self.prompt_builder = prompt_builder
        self.schedule: Schedule = schedule
        # One cap on live instances for every concurrent run of this runner (a service).
        self.instance_slots = None if instance_limit is None else Slots(instance_limit)
        self.stats = RunnerStats()
        # Without a factory a non-pure environment is one shared instance: runs take turns.
        self._shared_env_lock = asyncio.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Release resources held by ``restore_fn`` (idempotent)."""
        if self._closed:
            return
        self._closed = True
        closer = getattr(self.restore_fn, "aclose", None)
        if closer is not None:
            result = closer()
            if inspect.isawaitable(result):
                await result

    @property
    def multi_instance(self) -> bool:
        """True when each rollout gets its own instance from ``env_factory``."""
        return not self.environment.pure_step and self.env_factory is not None

    async def run_batch(
        self,
        tasks: Sequence[int | str | None],
        batch_size: int | None = None,
        *,
        seeds: Sequence[int | None] | None = None,
        max_steps: int | None = None,
        schedule: Schedule | None = None,
        rollout_ids: Sequence[int] | None = None,
        on_step: StepHook | None = None,
    ) -> list[Trajectory]:
        """Roll out one episode per task from ``reset(task)``; results in input order.

        ``rollout_ids`` (default: each input's position) are what the sampling seeds and
        scripted draws follow, with the task and the step: give each rollout its number
        within its task and a resumed run that leaves some out keeps the others' draws.
        ``on_step(index, step, transition)`` is given every step once it is settled (see
        ``StepHook``): what a run journals so that a kill loses no step.
        """
        tasks = _as_sequence("tasks", tasks)
        if seeds is not None and len(seeds) != len(tasks):
            raise ValueError(f"seeds has {len(seeds)} items but tasks has {len(tasks)}")
        specs = [
            RolloutInput(index=i, task=task, seed=None if seeds is None else seeds[i])
            for i, task in enumerate(tasks)
        ]
        specs = _with_ids(specs, rollout_ids, "tasks")
        return await self._collect(specs, batch_size, max_steps, schedule, on_step)

    async def run_batch_from_states(
        self,
        states: Sequence[State],
        batch_size: int | None = None,
        max_steps: int | None = None,
        *,
        schedule: Schedule | None = None,
        rollout_ids: Sequence[int] | None = None,
        prefixes: Sequence[Sequence[Transition]] | None = None,
        on_step: StepHook | None = None,
    ) -> list[Trajectory]:
        """Roll out from saved states (restored per instance when not pure); input order.
        ``rollout_ids`` and ``on_step`` as in ``run_batch``. ``prefixes``: resume rollouts,
        each from the steps it already took (``states[i]`` is where ``prefixes[i]`` led, an
        empty one starts afresh): each trajectory begins with its prefix, ``max_steps``
        counts it, and ``info["resumed_at_step"]`` says where it was resumed."""
        specs = _with_prefixes(_state_specs(states, None), prefixes)
        specs = _with_ids(specs, rollout_ids, "states")
        return await self._collect(specs, batch_size, max_steps, schedule, on_step)

    async def run_batch_from_state_actions(
        self,
        states: Sequence[State],
        actions: Sequence[Action | str],
        batch_size: int | None = None,
        max_steps: int | None = None,
        *,
        schedule: Schedule | None = None,
        rollout_ids: Sequence[int] | None = None,
    ) -> list[Trajectory]:
        """Like ``run_batch_from_states`` but rollout i's first action is ``actions[i]``
        (not generated): the Monte Carlo recipe for Q(s, a).
        """
        specs = _with_ids(_state_specs(states, actions), rollout_ids, "states")
        return await self._collect(specs, batch_size, max_steps, schedule)

    async def iter_batch_from_states(
        self,
        states: Sequence[State],
        batch_size: int | None = None,
        max_steps: int | None = None,
        *,
        actions: Sequence[Action | str] | None = None,
        schedule: Schedule | None = None,
        rollout_ids: Sequence[int] | None = None,
        prefixes: Sequence[Sequence[Transition]] | None = None,
        on_step: StepHook | None = None,
    ) -> AsyncGenerator[Trajectory, None]:
        """Yield trajectories as they finish (``Trajectory.index`` says which input;
        ``rollout_ids`` and ``on_step`` as in ``run_batch``, ``prefixes`` as in
        ``run_batch_from_states``).

        Wrap in ``contextlib.aclosing`` to tear instances down the moment you stop early.
        """
        specs = _with_prefixes(_state_specs(states, actions), prefixes)
        specs = _with_ids(specs, rollout_ids, "states")
        iterate = self._iterate(specs, batch_size, max_steps, schedule, on_step)
        async with contextlib.aclosing(iterate) as it:
            async for trajectory in it:
                yield trajectory

    def stream(
        self,
        inputs: Iterable[StreamInput] | AsyncIterable[StreamInput],
        *,
        group_size: int,
        batch_size: int,
        max_staleness: int | None = None,
        schedule: Schedule | None = None,
        max_steps: int | None = None,
        queue_size: int | None = None,
    ) -> RolloutStream:
        """Roll out ``group_size`` episodes per input (a task or a saved ``State``; the
        inputs may be an endless, async iterator) while the caller trains: ``async with
        runner.stream(...) as s: async for group in s``. At most ``batch_size`` rollouts
        live; at most ``queue_size`` groups outstanding (default: two batches' worth);
        ``max_staleness`` bounds how many policy versions a yielded group's oldest action
        is behind the backend's ``policy_version`` (see ``runner._stream``).
        """
        _check_positive("max_steps", max_steps)
        return RolloutStream(
            self,
            inputs,
            group_size=group_size,
            batch_size=batch_size,
            max_staleness=max_staleness,
            schedule=None if schedule is None else _check_schedule(schedule),
            max_steps=max_steps,
            queue_size=queue_size,
        )

    async def _collect(
        self,
        specs: list[RolloutInput],
        batch_size: int | None,
        max_steps: int | None,
        schedule: Schedule | None,
        on_step: StepHook | None = None,
    ) -> list[Trajectory]:
        results: list[Trajectory | None] = [None] * len(specs)
        try:
            iterate = self._iterate(specs, batch_size, max_steps, schedule, on_step)
            async with contextlib.aclosing(iterate) as it:
                async for trajectory in it:
                    assert trajectory.index is not None
                    results[trajectory.index] = trajectory
        except BaseException as exc:
            # A programming error (or a cancellation) must not lose the finished work.
            _attach_finished(exc, [t for t in results if t is not None], len(specs))
            raise
        missing = [i for i, t in enumerate(results) if t is None]
        if missing:  # pragma: no cover - every rollout is emitted by construction
            raise RuntimeError(f"internal error: no trajectory for inputs {missing}")
        return [t for t in results if t is not None]

    async def _iterate(
        self,
        specs: list[RolloutInput],
        batch_size: int | None,
        max_steps: int | None,
        schedule: Schedule | None,
        on_step: StepHook | None = None,
    ) -> AsyncGenerator[Trajectory, None]:
        _check_positive("batch_size", batch_size)
        rollouts = self._run(
            SpecSource(specs), batch_size or len(specs), max_steps, schedule, on_step
        )
        async with contextlib.aclosing(rollouts) as it:
            async for trajectory in it:
                yield trajectory

    async def _run(
        self,
        source: InputSource,
        batch_size: int,
        max_steps: int | None,
        schedule: Schedule | None,
        on_step: StepHook | None = None,
    ) -> AsyncGenerator[Trajectory, None]:
        """Every input of ``source``, at most ``batch_size`` live, as they finish."""
        if self._closed:
            raise ClosedError("TrajectoryRunner")
        _check_positive("batch_size", batch_size)
        _check_positive("max_steps", max_steps)
        schedule = self.schedule if schedule is None else _check_schedule(schedule)
        cfg = self._config(max_steps, on_step)
        if not self.environment.pure_step and self.env_factory is None:
            # One shared stateful instance: one rollout at a time, one run at a time.
            one = _scheduler(source, cfg, 1, schedule, None)
            async with self._shared_env_lock, contextlib.aclosing(one) as it:
                async for trajectory in it:
                    yield trajectory
            return
        shared = self.instance_slots if cfg.multi_instance else None
        rollouts = _scheduler(source, cfg, batch_size, schedule, shared)
        async with contextlib.aclosing(rollouts) as it:
            async for trajectory in it:
                yield trajectory

    def _config(self, max_steps: int | None, on_step: StepHook | None = None) -> RunConfig:
        return RunConfig(
            environment=self.environment,
            backend=self.backend,
            sampling_params=self.sampling_params,
            env_factory=self.env_factory,
            restore_fn=self.restore_fn,
            preamble=(
                *(
                    (ChatMessage(role="system", content=self.system_prompt),)
                    if self.system_prompt
                    else ()
                ),
                *self.example_turns,
            ),
            prompt_builder=self.prompt_builder,
            max_steps=max_steps if max_steps is not None else self.max_steps,
            step_timeout=self.step_timeout,
            restore_timeout=self.restore_timeout,
            close_timeout=self.close_timeout,
            stats=self.stats,
            tokens=self.tokens,
            tools=self.tools,
            tool_choice=self.tool_choice,
            keep_reasoning=self.keep_reasoning,
            coalesce_window=self.coalesce_window,
            on_step=on_step,
        )


def _scheduler(
    source: InputSource, cfg: RunConfig, limit: int, schedule: Schedule, shared: Slots | None
) -> AsyncGenerator[Trajectory, None]:
    if schedule == "async":
        return run_async(source, cfg, limit, shared)
    return run_rollouts(source, cfg, limit, schedule, shared)


def _attach_finished(exc: BaseException, done: list[Trajectory], total: int) -> None:
    """Put the trajectories finished before ``exc`` on it as ``exc.finished_trajectories``."""
    try:
        exc.finished_trajectories = tuple(done)  # type: ignore[attr-defined]
    except AttributeError:  # an exception type with __slots__: keep the note only
        pass
    if done:
        exc.add_note(
            f"llenvs_async: {len(done)} of {total} rollouts had finished; their trajectories "
            "are on this exception's `finished_trajectories`"
        )


def _with_stops(params: SamplingParams, stops: Sequence[str]) -> SamplingParams:
    """``params`` with the environment's stop sequences added (a text format's end of
    reply); the caller's own stop strings come first and none is repeated."""
    if isinstance(stops, str) or not all(isinstance(s, str) and s for s in stops):
        raise TypeError(
            f"the environment's stop_sequences must be non-empty strings, got {stops!r}"
        )
    merged = tuple(dict.fromkeys((*params.stop, *stops)))
    return params if merged == tuple(params.stop) else replace(params, stop=merged)


def _check_tools(tools: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    if isinstance(tools, Mapping | str) or not isinstance(tools, Sequence):
        raise TypeError(f"tools must be a sequence of tool definitions, got {tools!r:.80}")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                f"'parameters': ...}}}}, got {tool!r:.80}"
            )
    return tuple(tools)


def _check_schedule(schedule: Any) -> Schedule:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be 'refill', 'chunks' or 'async', got {schedule!r}")
    return schedule  # type: ignore[no-any-return]


def _check_positive(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number or None, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0 or None, got {value!r}")


def _as_sequence(name: str, items: Any) -> list[Any]:
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise TypeError(f"{name} must be a sequence (list or tuple), got {type(items).__name__}")
    if not items:
        raise ValueError(f"{name} is empty: nothing to roll out")
    return list(items)


def _with_ids(
    specs: list[RolloutInput], rollout_ids: Sequence[int] | None, what: str
) -> list[RolloutInput]:
    """``specs`` carrying the caller's rollout ids (their seeds' identity), checked."""
    if rollout_ids is None:
        return specs
    ids = _as_sequence("rollout_ids", rollout_ids)
    if len(ids) != len(specs):
        raise ValueError(f"rollout_ids has {len(ids)} items but {what} has {len(specs)}")
    for i, rollout_id in enumerate(ids):
        if type(rollout_id) is not int:
            raise TypeError(
                f"rollout_ids[{i}] must be an int, got {type(rollout_id).__name__} {rollout_id!r}"
            )
    return [replace(spec, rollout_id=r) for spec, r in zip(specs, ids, strict=True)]


def _with_prefixes(
    specs: list[RolloutInput], prefixes: Sequence[Sequence[Transition]] | None
) -> list[RolloutInput]:
    """``specs`` resuming from the steps each already took, checked against its state."""
    if prefixes is None:
        return specs
    given = _as_sequence("prefixes", prefixes)
    if len(given) != len(specs):
        raise ValueError(f"prefixes has {len(given)} items but states has {len(specs)}")
    out = []
    for i, (spec, prefix) in enumerate(zip(specs, given, strict=True)):
        steps = tuple(prefix)
        if any(not isinstance(t, Transition) for t in steps):
            raise TypeError(f"prefixes[{i}] must hold Transitions")
        assert spec.state is not None
        if steps and steps[-1].next_state.step != spec.state.step:
            raise ValueError(
                f"prefixes[{i}] ends at step {steps[-1].next_state.step} but states[{i}] is "
                f"at step {spec.state.step}: a prefix leads to its state"
            )
        out.append(replace(spec, prefix=steps))
    return out


def _state_specs(
    states: Sequence[State], actions: Sequence[Action | str] | None
) -> list[RolloutInput]:
    states = _as_sequence("states", states)
    for i, state in enumerate(states):
        if not isinstance(state, State):
            raise TypeError(f"states[{i}] must be a State, got {type(state).__name__}")
    if actions is None:
        return [RolloutInput(index=i, task=s.task, state=s) for i, s in enumerate(states)]
    actions = _as_sequence("actions", actions)
    if len(actions) != len(states):
        raise ValueError(
            f"actions has {len(actions)} items but states has {len(states)}: one forced "
            "first action per state is needed"
        )
    forced: list[Action] = []
    for i, action in enumerate(actions):
        if isinstance(action, str):
            action = Action(text=action)
        if not isinstance(action, Action):
            raise TypeError(f"actions[{i}] must be an Action or str, got {type(action).__name__}")
        forced.append(action)
    return [
        RolloutInput(index=i, task=s.task, state=s, forced_action=a)
        for i, (s, a) in enumerate(zip(states, forced, strict=True))
    ]
