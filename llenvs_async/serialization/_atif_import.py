"""``from_atif``: an ATIF document as our ``Trajectory``, with states a restore can replay.

A document we wrote (``extra["llenvs_async"]``) comes back exactly. Any other agent's is
read step by step: system steps are the run's system prompt (``info["system_prompt"]``), the
first user step is the initial observation, each agent step that runs shell commands is one
transition whose action is those commands as written (one per line, so a replay runs them;
the agent's message, reasoning, tool calls and token ids are kept as the transition's
``completion``), and its observation is the results' contents and any user steps after it.
An agent step that runs nothing is context for the next transition (``info["atif_context"]``).
A final step that marks the task complete terminates the trajectory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..types import (
    Action,
    ActionPath,
    Completion,
    ErrorInfo,
    Observation,
    State,
    TokenStep,
    ToolReply,
    Trajectory,
    Transition,
)
from . import from_dict
from ._atif_common import (
    KEY,
    AtifError,
    calls_of,
    check_step,
    generation,
    ints,
    is_atif,
    openai_calls,
    ours_of,
    results_of,
    text_of,
    unplain,
)
from ._atif_foreign import CommandOf, ForeignReader, shell_command

__all__ = ["AtifError", "CommandOf", "from_atif", "is_atif", "openai_calls", "shell_command"]


def from_atif(
    data: Mapping[str, Any],
    *,
    task: int | str | None = None,
    hidden: Any = None,
    skip_unknown_tools: bool = False,
    submit_word: str = "SUBMIT",
    command_of: CommandOf = shell_command,
) -> Trajectory:
    """The trajectory of an ATIF document. A document we wrote comes back exactly; for any
    other, ``task`` and ``hidden`` are every state's environment identity (for a Harbor
    task: its name, and ``{"task_name", "task_index", ...}`` as ``HarborEnvironment`` keeps
    it). A tool call ``command_of`` cannot read as a shell command raises ``AtifError``
    (its effect on the container would not replay) unless ``skip_unknown_tools``."""
    if not is_atif(data):
        version = data.get("schema_version") if isinstance(data, Mapping) else None
        raise AtifError(
            f"not an ATIF trajectory: schema_version={version!r} (expected 'ATIF-v1.x') "
            "and a 'steps' list are required",
            field="schema_version",
            value=version,
        )
    steps = [check_step(s, i) for i, s in enumerate(data["steps"])]
    extra = data.get("extra")
    ours = extra.get(KEY) if isinstance(extra, Mapping) else None
    if isinstance(ours, Mapping) and ours.get("format") == 1:
        return _ours(steps, ours)
    episode = data.get("session_id")
    reader = ForeignReader(task, hidden, skip_unknown_tools, submit_word, command_of)
    return reader.read(steps, episode if isinstance(episode, str) else "")


# -- a document we wrote -----------------------------------------------------------------


def _ours(steps: list[Mapping[str, Any]], ours: Mapping[str, Any]) -> Trajectory:
    start = ours.get("start") or {}
    users = [s for s in steps if s["source"] == "user"]
    if not users:
        raise AtifError("steps: no user step with the initial observation", field="steps")
    first = ours_of(users[0])
    initial = Observation(text=text_of(users[0]["message"]), data=unplain(first.get("data")) or {})
    prefix = start.get("prefix")
    path = ActionPath(
        None if first.get("no_initial") else initial,
        prefix=None if prefix is None else ints(prefix),
    )
    agent = [s for s in steps if s["source"] == "agent"]
    copied = [s for s in agent if s.get("is_copied_context")]
    for step in copied:
        action, completion, observation = _agent(step)
        path = path.append(action, observation, tokens=_token_step(step, completion))
        if "prefix" in ours_of(step):
            path = path.with_prefix(ints(ours_of(step)["prefix"]))
    state = State(
        observation=_agent(copied[-1])[2] or initial if copied else initial,
        task=ours.get("task"),
        step=int(start.get("step", len(copied))),
        episode_id=str(start.get("episode_id", "")),
        actions=path,
        hidden=unplain(start.get("hidden")),
        info=unplain(start.get("info")) or {},
        seed=start.get("seed"),
    )
    begin, transitions = state, []
    for step in agent[len(copied) :]:
        mine = ours_of(step)
        action, completion, observation = _agent(step)
        assert observation is not None
        tokens = _token_step(step, completion)
        path = path.append(action, observation, tokens=tokens)
        info = unplain(mine.get("info")) or {}
        after = State(
            observation=observation,
            task=state.task,
            step=state.step + 1,
            episode_id=state.episode_id,
            actions=path,
            terminated=bool(mine.get("terminated")),
            truncated=bool(mine.get("truncated")),
            hidden=unplain(mine["hidden"]) if "hidden" in mine else state.hidden,
            info=unplain(mine["state_info"]) if "state_info" in mine else info,
            seed=state.seed,
        )
        transitions.append(
            Transition(
                state=state,
                action=action,
                next_state=after,
                reward=float(mine.get("reward", 0.0)),
                completion=completion,
                info=info,
                tokens=tokens,
            )
        )
        state = after
    error = ours.get("error")
    return Trajectory(
        episode_id=str(ours.get("episode_id", "")),
        initial_state=begin,
        transitions=tuple(transitions),
        error=None if error is None else from_dict(ErrorInfo, error),
        index=ours.get("index"),
        stop_reason=ours.get("stop_reason", "unfinished"),
        info=unplain(ours.get("info")) or {},
        end_reward=float(ours.get("end_reward", 0.0)),
    )


def _agent(step: Mapping[str, Any]) -> tuple[Action, Completion | None, Observation | None]:
    """An agent step we wrote: the action, the generation, the observation after."""
    mine = ours_of(step)
    message = text_of(step.get("message"))
    rebuilt = openai_calls(calls_of(step))
    completion = None
    if "completion" in mine:
        c = mine["completion"]
        base = generation(step, message, rebuilt)
        raw_calls = mine.get("completion_tool_calls")
        completion = replace(
            base,
            finish_reason=c.get("finish_reason"),
            prompt_token_ids=base.prompt_token_ids if c.get("prompt_ids") else (),
            logprobs=base.logprobs if c.get("logprobs") else None,
            tool_calls=rebuilt if raw_calls is None else tuple(unplain(raw_calls)),
            policy_version=c.get("policy_version"),
            version_spans=tuple(tuple(s) for s in c.get("version_spans") or ()),
        )
    if "action" in mine:
        action = from_dict(Action, mine["action"])
    else:
        action = Action(text=message, tool_calls=rebuilt if completion is not None else ())
    if completion is not None and not mine.get("forced"):
        action = replace(action, completion=completion)
    if mine.get("no_observation"):
        return action, completion, None
    extra = mine.get("observation") or {}
    results = results_of(step)
    text = (
        extra["text"] if "text" in extra else text_of(results[0].get("content") if results else "")
    )
    data = dict(unplain(extra.get("data")) or {})
    raw = extra.get("tool_replies", data.pop("tool_replies", None))  # in data: before 2026-12-07
    if raw is not None:
        replies = tuple(ToolReply(tool_call_id=str(r["tool_call_id"]), content=str(r["content"]))
                        for r in raw)  # fmt: skip
    elif results and all("source_call_id" in r for r in results):
        replies = tuple(
            ToolReply(tool_call_id=str(r["source_call_id"]), content=text_of(r.get("content")))
            for r in results
        )
    else:
        replies = ()
    return action, completion, Observation(text=text, data=data, tool_replies=replies)


def _token_step(step: Mapping[str, Any], completion: Completion | None) -> TokenStep | None:
    tokens = ours_of(step).get("tokens")
    if not isinstance(tokens, Mapping):
        return None
    action_ids = tokens.get("action_ids")
    return TokenStep(
        action_ids=ints(action_ids)
        if action_ids is not None or completion is None
        else completion.token_ids,
        observation_ids=ints(tokens.get("observation_ids")),
        sampled=bool(tokens.get("sampled", True)),
    )
