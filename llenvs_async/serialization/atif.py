"""ATIF (Harbor's Agent Trajectory Interchange Format): our trajectories out, any agent's in.

``to_atif(trajectory)`` is one ATIF document (a JSON dict, ``ATIF-v1.5``): a user step with
the initial observation, then one agent step per transition (``message``,
``reasoning_content``, ``tool_calls``, ``observation.results`` answering them by
``source_call_id``, and ``metrics`` with the prompt / completion token ids and logprobs).
The steps of a state's history before the trajectory started (a rollout from a restored
state) come first, marked ``is_copied_context``. What ATIF has no field for (per-step
rewards and info, states' ``hidden``, token-mode deltas, the failure) is kept under
``extra["llenvs_async"]``, so ``from_atif(to_atif(t))`` gives ``t`` back. ``from_atif`` also
reads what any Harbor agent wrote (see ``_atif_import``).

Pure functions over dicts: Harbor is not needed, except by ``validate`` (its pydantic
models: ``pip install 'llenvs-async[atif]'``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from .._extras import import_extra
from ..errors import MissingExtraError
from ..types import (
    Action,
    ActionPath,
    Completion,
    HistoryStep,
    Observation,
    State,
    TokenStep,
    Trajectory,
)
from . import to_dict
from ._atif_common import KEY as EXTRA_KEY
from ._atif_import import AtifError, CommandOf, from_atif, is_atif, openai_calls, shell_command

__all__ = [
    "ATIF_VERSION",
    "EXTRA_KEY",
    "AtifError",
    "AtifUnavailableError",
    "CommandOf",
    "TRAJECTORY_FILE",
    "find_atif_files",
    "from_atif",
    "is_atif",
    "iter_atif",
    "read_atif",
    "shell_command",
    "to_atif",
    "validate",
    "write_atif",
]

ATIF_VERSION = "ATIF-v1.5"
TRAJECTORY_FILE = Path("agent") / "trajectory.json"
"""Where a Harbor trial keeps its trajectory: ``<trial dir>/agent/trajectory.json``."""


# The name this module's error had before every extra shared one (kept for ``except`` clauses).
AtifUnavailableError = MissingExtraError


def to_atif(
    trajectory: Trajectory,
    *,
    agent_name: str = "llenvs-async",
    agent_version: str = __version__,
    model_name: str | None = None,
    system_prompt: str | None = None,
    tools: Sequence[Mapping[str, Any]] = (),
    source: Mapping[str, Any] | None = None,
    rollout: int | None = None,
) -> dict[str, Any]:
    """``trajectory`` as one ATIF document. ``system_prompt`` and ``tools`` (OpenAI function
    schemas) are what the run offered the model; ``source`` (a results file's ``source``)
    and ``rollout`` are kept so the import can rebuild the environment."""
    start = trajectory.initial_state
    history = start.history
    steps: list[dict[str, Any]] = []
    if system_prompt:
        steps.append({"step_id": 1, "source": "system", "message": system_prompt})
    initial = history.initial
    user: dict[str, Any] = {
        "step_id": len(steps) + 1,
        "source": "user",
        "message": "" if initial is None else initial.text,
    }
    if initial is None:  # a state built from a bare action tuple
        user["extra"] = {EXTRA_KEY: {"no_initial": True}}
    elif initial.data:
        user["extra"] = {EXTRA_KEY: {"data": _plain(initial.data)}}
    steps.append(user)
    for past in history:
        steps.append(_copied_step(len(steps) + 1, past))
    hidden = start.hidden
    prompt = _prefix_of(start)
    for t in trajectory.transitions:
        step = _agent_step(
            len(steps) + 1,
            t.action,
            t.completion,
            t.next_state.observation,
            prompt=prompt,
        )
        ours: dict[str, Any] = {
            "reward": t.reward,
            "info": _plain(t.info),
            "terminated": t.next_state.terminated,
            "truncated": t.next_state.truncated,
        }
        if t.next_state.hidden != hidden:
            ours["hidden"] = _plain(t.next_state.hidden)
        if t.next_state.info != t.info:
            ours["state_info"] = _plain(t.next_state.info)
        if t.action.completion is None:
            ours["forced"] = True
        if t.tokens is not None:
            ours["tokens"] = _tokens(t.tokens, t.completion)
        step["extra"][EXTRA_KEY].update(ours)
        steps.append(step)
        hidden = t.next_state.hidden
        prompt = _prefix_of(t.next_state)
    return _document(
        trajectory, steps, agent_name, agent_version, model_name, tools, source, rollout
    )


def _document(
    trajectory: Trajectory,
    steps: list[dict[str, Any]],
    agent_name: str,
    agent_version: str,
    model_name: str | None,
    tools: Sequence[Mapping[str, Any]],
    source: Mapping[str, Any] | None,
    rollout: int | None,
) -> dict[str, Any]:
    start = trajectory.initial_state
    agent: dict[str, Any] = {"name": agent_name, "version": agent_version}
    if model_name is not None:
        agent["model_name"] = model_name
    if tools:
        agent["tool_definitions"] = [dict(tool) for tool in tools]
    error = trajectory.error
    ours: dict[str, Any] = {
        "format": 1,
        "task": start.task,
        "episode_id": trajectory.episode_id,
        "index": trajectory.index,
        "rollout": rollout,
        "stop_reason": trajectory.stop_reason,
        "total_reward": trajectory.total_reward,
        "end_reward": trajectory.end_reward,
        "success": trajectory.success,
        "error": None if error is None else to_dict(error),
        "info": _plain(trajectory.info),
        "source": None if source is None else dict(source),
        "start": {
            "episode_id": start.episode_id,
            "step": start.step,
            "hidden": _plain(start.hidden),
            "info": _plain(start.info),
            "seed": start.seed,
            "prefix": _ids(start.history.prefix),
        },
    }
    prompt_total = sum(len(s.get("metrics", {}).get("prompt_token_ids", ())) for s in steps)
    completion_total = sum(len(s.get("metrics", {}).get("completion_token_ids", ())) for s in steps)
    return {
        "schema_version": ATIF_VERSION,
        "session_id": trajectory.episode_id or None,
        "agent": agent,
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": prompt_total,
            "total_completion_tokens": completion_total,
            "total_steps": len(steps),
            "extra": {"total_reward": trajectory.total_reward, "success": trajectory.success},
        },
        "extra": {EXTRA_KEY: ours},
    }


def _copied_step(step_id: int, past: HistoryStep) -> dict[str, Any]:
    """A step of the start state's history: context the trajectory continued from."""
    observation = past.observation
    step = _agent_step(step_id, past.action, past.completion, observation, prompt=None)
    step["is_copied_context"] = True
    ours = step["extra"][EXTRA_KEY]
    if observation is None:
        ours["no_observation"] = True
    if past.tokens is not None:
        ours["tokens"] = _tokens(past.tokens, past.completion)
    if past.prefix is not None:
        ours["prefix"] = list(past.prefix)
    return step


def _agent_step(
    step_id: int,
    action: Action,
    completion: Completion | None,
    observation: Observation | None,
    *,
    prompt: tuple[int, ...] | None,
) -> dict[str, Any]:
    """One agent step: the generation (or the forced action) and the observation after it;
    ``extra`` keeps what the ATIF fields cannot say exactly."""
    ours: dict[str, Any] = {}
    message = action.text if completion is None else completion.text
    raw_calls = action.tool_calls if completion is None else completion.tool_calls
    shown = None if observation is None else observation.data.get("shown_action")
    if not raw_calls and isinstance(shown, Mapping):  # a forced action, as the model saw it
        raw_calls = tuple(shown.get("tool_calls") or ())
    calls = [_atif_call(raw, i) for i, raw in enumerate(raw_calls)]
    step: dict[str, Any] = {"step_id": step_id, "source": "agent", "message": message}
    if completion is not None and completion.reasoning is not None:
        step["reasoning_content"] = completion.reasoning
    if calls:
        step["tool_calls"] = calls
    rebuilt_calls = openai_calls(calls)
    if completion is not None and tuple(completion.tool_calls) != rebuilt_calls:
        ours["completion_tool_calls"] = _plain(list(completion.tool_calls))
    rebuilt = Action(text=message, tool_calls=rebuilt_calls if completion is not None else ())
    if (action.text, tuple(action.tool_calls)) != (rebuilt.text, rebuilt.tool_calls):
        ours["action"] = to_dict(action)
    if observation is not None:
        step["observation"], ours["observation"] = _observation(observation, calls)
    if completion is not None:
        step["metrics"] = _metrics(completion, prompt)
        ours["completion"] = {
            "finish_reason": completion.finish_reason,
            "prompt_ids": bool(completion.prompt_token_ids),
            "policy_version": completion.policy_version,
            "version_spans": [list(s) for s in completion.version_spans],
            "logprobs": completion.logprobs is not None,
        }
    step["extra"] = {EXTRA_KEY: ours}
    return step


def _atif_call(raw: Any, index: int) -> dict[str, Any]:
    """An OpenAI tool call as an ATIF ``ToolCall`` (arguments decoded to an object)."""
    raw = raw if isinstance(raw, Mapping) else {}
    function = raw.get("function") if isinstance(raw.get("function"), Mapping) else {}
    arguments: Any = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = None
    call_id = raw.get("id")
    return {
        "tool_call_id": call_id if isinstance(call_id, str) and call_id else f"call_{index}",
        "function_name": str(function.get("name") or ""),
        "arguments": arguments if isinstance(arguments, dict) else {},
    }


def _observation(
    observation: Observation, calls: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """ATIF ``observation`` (one result per tool reply, ids kept where a call of the step
    has them; else one result) and what our extra adds (text, data and tool replies, where
    the results do not give them back)."""
    ids = {c["tool_call_id"] for c in calls}
    replies = observation.tool_replies
    results: list[dict[str, Any]] = []
    for reply in replies:
        result: dict[str, Any] = {"content": reply.content}
        if reply.tool_call_id in ids:
            result["source_call_id"] = reply.tool_call_id
        results.append(result)
    if not replies:
        results.append({"content": observation.text})
    extra: dict[str, Any] = {}
    if len(results) != 1 or results[0]["content"] != observation.text:
        extra["text"] = observation.text
    if observation.data:
        extra["data"] = _plain(observation.data)
    if any(reply.tool_call_id not in ids for reply in replies):  # not derivable on import
        extra["tool_replies"] = [
            {"tool_call_id": r.tool_call_id, "content": r.content} for r in replies
        ]
    return {"results": results}, extra


def _metrics(completion: Completion, prompt: tuple[int, ...] | None) -> dict[str, Any]:
    prompt_ids = completion.prompt_token_ids or prompt or ()
    metrics: dict[str, Any] = {"completion_tokens": len(completion.token_ids)}
    if prompt_ids:
        metrics["prompt_tokens"] = len(prompt_ids)
        metrics["prompt_token_ids"] = list(prompt_ids)
    if completion.token_ids:
        metrics["completion_token_ids"] = list(completion.token_ids)
    if completion.logprobs is not None:
        metrics["logprobs"] = list(completion.logprobs)
    return metrics


def _prefix_of(state: State) -> tuple[int, ...] | None:
    """The prompt ids the policy was sent at ``state`` (token mode; else None)."""
    path = state.actions
    return path.token_prefix() if isinstance(path, ActionPath) else None


def _tokens(tokens: TokenStep, completion: Completion | None) -> dict[str, Any]:
    """A token-mode step's delta: the observation ids, and the action ids unless they are
    the completion's (``metrics.completion_token_ids``)."""
    out: dict[str, Any] = {
        "observation_ids": list(tokens.observation_ids),
        "sampled": tokens.sampled,
    }
    if completion is None or tuple(completion.token_ids) != tuple(tokens.action_ids):
        out["action_ids"] = list(tokens.action_ids)
    return out


def _plain(value: Any) -> Any:
    """A free-form value (info, hidden, data) as JSON, tuples tagged as our JSONL does."""
    return to_dict(Observation(text="", data={"v": value})).get("data", {}).get("v")


def _ids(ids: tuple[int, ...] | None) -> list[int] | None:
    return None if ids is None else list(ids)


# -- files ---------------------------------------------------------------------------------


def write_atif(document: Mapping[str, Any], trial_dir: Path) -> Path:
    """Write ``document`` as ``trial_dir/agent/trajectory.json`` (Harbor's trial layout, which
    its viewer and trace exporter read); returns the file."""
    target = trial_dir / TRAJECTORY_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=1, ensure_ascii=False), encoding="utf-8")
    return target


def find_atif_files(path: Path) -> list[Path]:
    """``path`` itself, or the ATIF documents under a directory (sorted): files named
    ``trajectory.json`` and other ``*.json`` whose root names an ATIF ``schema_version``."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise AtifError(f"{path}: no such file or directory", path=str(path))
    return [p for p in sorted(path.rglob("*.json")) if p.is_file() and _looks_atif(p)]


def _looks_atif(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"schema_version"' in head and b"ATIF-" in head


def read_atif(path: Path) -> dict[str, Any]:
    """One ATIF document from ``path`` (checked to be one: ``AtifError`` naming the file)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise AtifError(f"{path}: not a readable JSON document ({exc})", path=str(path)) from None
    if not is_atif(data):
        version = data.get("schema_version") if isinstance(data, dict) else None
        raise AtifError(
            f"{path}: not an ATIF trajectory (schema_version={version!r}, expected 'ATIF-v1.x')",
            path=str(path),
            field="schema_version",
            value=version,
        )
    return dict(data)


def iter_atif(paths: Sequence[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every ATIF document under ``paths`` (files or directories), with its file."""
    for path in paths:
        for file in find_atif_files(path):
            yield file, read_atif(file)


def validate(document: Mapping[str, Any]) -> Any:
    """``document`` checked by Harbor's own pydantic models: the ``Trajectory`` model, or
    ``AtifError`` saying what is wrong. Needs the ``atif`` extra."""
    models = import_extra("harbor.models.trajectories", extra="atif",
                          what="validating ATIF", package="Harbor's models")  # fmt: skip
    from pydantic import ValidationError

    try:
        return models.Trajectory.model_validate(dict(document))
    except ValidationError as exc:
        raise AtifError(f"not valid ATIF: {exc}", field="document") from None
