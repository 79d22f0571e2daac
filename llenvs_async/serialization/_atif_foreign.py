"""Reading an ATIF document another agent wrote (see ``_atif_import``): its shell commands as
actions a restore replays, its generations kept as the transitions' completions."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from ..types import Action, Observation, State, Trajectory, Transition
from ._atif_common import AtifError, calls_of, generation, openai_calls, results_of, text_of

__all__ = ["SUBMIT_TOOLS", "CommandOf", "ForeignReader", "shell_command"]

SUBMIT_TOOLS = frozenset({"submit", "mark_task_complete", "task_complete"})
_SHELLS = frozenset({"bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/usr/bin/bash"})

CommandOf = Callable[[str, Mapping[str, Any]], str | None]
"""``(function_name, arguments) -> the shell command the call ran`` (None: not a shell call)."""


def shell_command(name: str, arguments: Mapping[str, Any]) -> str | None:
    """The shell command of a tool call as Harbor's agents record them: ``command`` or ``cmd``
    (a string, or an argv such as ``["bash", "-lc", "..."]``) and Terminus's ``keystrokes``
    (the trailing Enter dropped). None for anything else (a file editor, a search, ...)."""
    for key in ("command", "cmd"):
        value = arguments.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            if len(value) == 3 and value[0] in _SHELLS and value[1] in ("-c", "-lc"):
                return str(value[2]).strip()
            return shlex.join(value)
    keys = arguments.get("keystrokes")
    if isinstance(keys, str) and keys.strip():
        return keys.rstrip("\n").strip()
    return None


class ForeignReader:
    """Reads a document another agent wrote (see the module docstring)."""

    def __init__(
        self,
        task: int | str | None,
        hidden: Any,
        skip_unknown_tools: bool,
        submit_word: str,
        command_of: CommandOf,
    ) -> None:
        self.task, self.hidden, self.skip = task, hidden, skip_unknown_tools
        self.submit_word, self.command_of = submit_word, command_of

    def read(self, steps: list[Mapping[str, Any]], episode_id: str) -> Trajectory:
        system = [text_of(s["message"]) for s in steps if s["source"] == "system"]
        first_user = next((i for i, s in enumerate(steps) if s["source"] == "user"), None)
        first_agent = next((i for i, s in enumerate(steps) if s["source"] == "agent"), len(steps))
        opening = first_user if first_user is not None and first_user < first_agent else None
        initial = Observation(text="" if opening is None else text_of(steps[opening]["message"]))
        state = State(
            observation=initial, task=self.task, episode_id=episode_id, hidden=self.hidden
        )
        begin, transitions, context = state, [], []
        agent_ids = [i for i, s in enumerate(steps) if s["source"] == "agent"]
        for i in agent_ids:
            step = steps[i]
            commands, submits, ignored = self._commands(step, final=i == agent_ids[-1])
            message = text_of(step.get("message"))
            if not commands and not submits:
                context.append({"step_id": step.get("step_id"), "message": message})
                continue
            later = [
                text_of(s["message"])
                for s in steps[i + 1 : _next_agent(steps, i)]
                if s["source"] == "user"
            ]
            text = "\n".join(
                x for x in (*(text_of(r.get("content")) for r in results_of(step)), *later) if x
            )
            command = "\n".join(commands) if commands else self.submit_word
            info: dict[str, Any] = {"command": command, "atif_step_id": step.get("step_id")}
            if context:
                info["atif_context"], context = context, []
            if ignored:
                info["atif_ignored_calls"] = ignored
            if submits:
                info["submitted"] = True
            action = Action(text=command)
            observation = Observation(text=text)
            llm = step.get("llm_call_count") != 0
            completion = generation(step, message, openai_calls(calls_of(step))) if llm else None
            after = state.advance(action, observation, terminated=submits, info=info)
            transitions.append(
                Transition(
                    state=state, action=action, next_state=after, completion=completion, info=info
                )
            )
            state = after
        meta: dict[str, Any] = {}
        if system:
            meta["system_prompt"] = "\n\n".join(system)
        if context:
            meta["atif_context"] = context
        return Trajectory(
            episode_id=episode_id,
            initial_state=begin,
            transitions=tuple(transitions),
            stop_reason="terminated" if state.terminated else "unfinished",
            info=meta,
        )

    def _commands(
        self, step: Mapping[str, Any], *, final: bool
    ) -> tuple[list[str], bool, list[str]]:
        """The step's shell commands, whether it submits (a completion marker on the last
        agent step) and the calls skipped as not replayable."""
        commands: list[str] = []
        submits = False
        ignored: list[str] = []
        for call in calls_of(step):
            name = str(call.get("function_name") or "")
            arguments = call.get("arguments")
            command = self.command_of(name, arguments if isinstance(arguments, Mapping) else {})
            if command is not None:
                commands.append(command)
            elif name in SUBMIT_TOOLS:
                submits = submits or final
            elif self.skip:
                ignored.append(name)
            else:
                raise AtifError(
                    f"steps[step_id={step.get('step_id')}]: tool call {name!r} "
                    f"({json.dumps(arguments)[:80]}) is not a shell command, so its effect "
                    "on the environment would not replay; pass skip_unknown_tools=True "
                    "(--skip-unknown-tools) to import without it",
                    step_id=step.get("step_id"),
                    field="function_name",
                    value=name,
                )
        return commands, submits, ignored


def _next_agent(steps: list[Mapping[str, Any]], index: int) -> int:
    return next(
        (j for j in range(index + 1, len(steps)) if steps[j]["source"] == "agent"), len(steps)
    )
