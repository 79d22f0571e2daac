"""Value types encoded as dicts of JSON values (``to_dict``); a history is written once per
trajectory, successors marked ``"+1"``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..types import (
    Action,
    ActionPath,
    Completion,
    ErrorInfo,
    History,
    HistoryStep,
    Observation,
    State,
    TokenRecord,
    TokenStep,
    Trajectory,
    Transition,
)
from ._values import (
    _EXTENDS,
    _PREFIX,
    FORMAT_VERSION,
    SerializationError,
    _encode_mapping,
    _encode_value,
    _prompts_before,
)

Serializable = Action | Observation | State | Completion | Transition | Trajectory | ErrorInfo


def _action(action: Action) -> dict[str, Any]:
    out: dict[str, Any] = {"text": action.text}
    if action.tool_calls:
        out["tool_calls"] = [_encode_value(c, "Action.tool_calls") for c in action.tool_calls]
    return out


def _observation(obs: Observation) -> dict[str, Any]:
    out: dict[str, Any] = {"text": obs.text}
    if obs.data:
        out["data"] = _encode_mapping(obs.data, "Observation.data")
    if obs.tool_replies:
        out["tool_replies"] = [
            {"tool_call_id": r.tool_call_id, "content": r.content} for r in obs.tool_replies
        ]
    return out


def _history(history: History, base: History | None = None) -> dict[str, Any]:
    """The history; with ``base`` (the previous state's, when this one shares its nodes)
    only the steps added to it."""
    steps = list(history)
    shared = base is not None and _shares(steps, history, base)
    start = len(base) if base is not None and shared else 0
    prompts = _prompts_before(steps, history.prefix)
    out: dict[str, Any] = {
        "initial": None if history.initial is None else _observation(history.initial),
        "extend" if shared else "steps": [
            _history_step(step, prompts[i]) for i, step in enumerate(steps) if i >= start
        ],
    }
    if not shared and history.prefix is not None:
        out["prefix"] = list(history.prefix)
    return out


def _shares(steps: list[HistoryStep], history: History, base: History) -> bool:
    """Whether ``history`` starts with ``base``'s steps, token ids included."""
    prefix = list(base)
    return (
        len(prefix) <= len(steps)
        and steps[: len(prefix)] == prefix
        and history.prefix == base.prefix
        and all(
            a.tokens == b.tokens and a.prefix == b.prefix
            for a, b in zip(steps, prefix, strict=False)
        )
    )


def _history_step(step: HistoryStep, prompt: tuple[int, ...] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "action": _action(step.action),
        "observation": None if step.observation is None else _observation(step.observation),
        "completion": None if step.completion is None else _completion(step.completion, prompt),
    }
    if step.tokens is not None:
        out["tokens"] = _token_step(step.tokens)
    if step.prefix is not None:
        out["prefix"] = list(step.prefix)
    return out


def _token_step(step: TokenStep) -> dict[str, Any]:
    return {
        "action_ids": list(step.action_ids),
        "observation_ids": list(step.observation_ids),
        "sampled": step.sampled,
    }


def _token_record(record: TokenRecord) -> dict[str, Any]:
    return {
        "input_ids": list(record.input_ids),
        "loss_mask": list(record.loss_mask),
        "logprobs": None if record.logprobs is None else list(record.logprobs),
        "turns": [list(span) for span in record.turns],
        "prompt_length": record.prompt_length,
    }


def _extends(t: Transition) -> bool:
    """Whether ``t.next_state``'s history is ``t.state``'s plus exactly this transition."""
    history, last = t.next_state.history, t.next_state.history.last
    return (
        history.extends(t.state.history)
        and last is not None
        and last.action == t.action
        and last.completion == t.completion
        and last.observation == t.next_state.observation
        and last.tokens == t.tokens
        and last.prefix is None
    )


def _state(state: State, *, extends: bool = False, base: State | None = None) -> dict[str, Any]:
    if state.task is not None and not isinstance(state.task, int | str):
        raise SerializationError(f"State.task: expected int, str or None, got {state.task!r:.60}")
    out: dict[str, Any] = {
        "observation": _observation(state.observation),
        "task": state.task,
        "step": state.step,
        "episode_id": state.episode_id,
        "terminated": state.terminated,
        "truncated": state.truncated,
        "hidden": _encode_value(state.hidden, "State.hidden"),
        "seed": state.seed,
        "history": _EXTENDS
        if extends
        else _history(state.history, None if base is None else base.history),
    }
    if state.info:
        out["info"] = _encode_mapping(state.info, "State.info")
    return out


def _completion(c: Completion, prompt: tuple[int, ...] | None = None) -> dict[str, Any]:
    """A completion; its prompt ids are written as ``"prefix"`` when they are the token
    prefix of the state it was sampled from (token mode), so files stay O(tokens)."""
    same = prompt is not None and bool(c.prompt_token_ids) and c.prompt_token_ids == prompt
    return {
        "text": c.text,
        "token_ids": list(c.token_ids),
        "logprobs": None if c.logprobs is None else list(c.logprobs),
        "finish_reason": c.finish_reason,
        "prompt_token_ids": _PREFIX if same else list(c.prompt_token_ids),
        **(
            {"tool_calls": [_encode_value(t, "Completion.tool_calls") for t in c.tool_calls]}
            if c.tool_calls
            else {}
        ),
        **({} if c.reasoning is None else {"reasoning": c.reasoning}),
        **({} if c.policy_version is None else {"policy_version": c.policy_version}),
        **({"version_spans": [list(s) for s in c.version_spans]} if c.version_spans else {}),
    }


def _error(e: ErrorInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": e.type,
        "message": e.message,
        "phase": e.phase,
        "traceback": e.traceback,
    }
    if e.details:
        out["details"] = _encode_mapping(e.details, "ErrorInfo.details")
    return out


def _reward(value: Any) -> float:
    """A reward as a JSON number: a bool or a numpy scalar is written as the float it means,
    so that every file the writer accepts can be read back.
    """
    if type(value) is float:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise SerializationError(
            f"Transition.reward: a {type(value).__name__} ({value!r:.60}) is not a number"
        ) from None


def _transition(t: Transition, state: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "action": _action(t.action),
        "next_state": _state(t.next_state, extends=_extends(t), base=t.state),
        "reward": _reward(t.reward),
        "completion": None if t.completion is None else _completion(t.completion, _prompt(t)),
    }
    if t.tokens is not None:
        out["tokens"] = _token_step(t.tokens)
    if state is not None:
        out["state"] = state
    if t.info:
        out["info"] = _encode_mapping(t.info, "Transition.info")
    return out


def _prompt(t: Transition) -> tuple[int, ...] | None:
    if t.tokens is None or t.completion is None or not t.completion.prompt_token_ids:
        return None
    path = t.state.actions
    return path.token_prefix() if isinstance(path, ActionPath) else None


def _trajectory(traj: Trajectory) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    previous = traj.initial_state
    for t in traj.transitions:
        # A transition's state is normally the previous next_state: store it only if not.
        state = (
            None if t.state is previous or t.state == previous else _state(t.state, base=previous)
        )
        steps.append(_transition(t, state))
        previous = t.next_state
    out: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "episode_id": traj.episode_id,
        "initial_state": _state(traj.initial_state),
        "transitions": steps,
        "error": None if traj.error is None else _error(traj.error),
        "index": traj.index,
        "stop_reason": traj.stop_reason,
    }
    if traj.info:
        out["info"] = _encode_mapping(traj.info, "Trajectory.info")
    if traj.end_reward:
        out["end_reward"] = _reward(traj.end_reward)
    record = traj.token_record()
    if record is not None:
        out["tokens"] = _token_record(record)
    return out


_ENCODERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    Trajectory: _trajectory,
    Transition: lambda t: _transition(t, _state(t.state)),
    State: _state,
    Action: _action,
    Observation: _observation,
    Completion: _completion,
    ErrorInfo: _error,
}


def to_dict(obj: Serializable) -> dict[str, Any]:
    """Encode a value type as a dict of JSON values (``json.dumps``-ready)."""
    encoder = _ENCODERS.get(type(obj))
    if encoder is None:
        raise TypeError(f"to_dict() cannot encode a {type(obj).__name__}")
    return encoder(obj)
