"""A user-defined agent protocol: Terminus-2-style JSON replies.

After any reasoning, the reply is one JSON object whose keystrokes run in order, then
``task_complete`` submits. Use it as ``DockerEnvironment(..., action_format=JsonProtocol())``.

    python examples/json_protocol.py   # parses a sample reply
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from llenvs_async import Action, Completion, Observation
from llenvs_async.protocols import AgentProtocol, Call, CallResult, Parsed, is_model_output

EXPECTED = (
    'Reply with one JSON object: {"analysis": "what you see", '
    '"commands": [{"keystrokes": "ls -la\\n"}], "task_complete": false}.'
)


class JsonProtocol(AgentProtocol):
    """Replies are ``{"analysis", "commands": [{"keystrokes"}], "task_complete"}``."""

    name = "json"

    def instructions(self) -> str:
        return (
            "You are working in a Linux shell to complete a task. "
            f"{EXPECTED} The keystrokes run in order in a persistent shell; set "
            "task_complete to true when the task is done."
        )

    def parse(self, action: Action) -> Parsed:
        """A command as written that is already this format's JSON (a replayed rendering)."""
        if not is_model_output(action) and action.text.startswith('{"analysis"'):
            return self._parse_reply(action)
        return super().parse(action)

    def _parse_reply(self, action: Action) -> Parsed:
        text = action.text.rpartition("</think>")[2].strip()
        try:
            reply = json.loads(text[text.find("{") : text.rfind("}") + 1])
        except ValueError as exc:
            return Parsed(error=f"the reply is not a JSON object ({exc})")
        commands = reply.get("commands") if isinstance(reply, dict) else None
        if not isinstance(commands, list):
            return Parsed(error='the reply has no "commands" list')
        keys = [c.get("keystrokes") if isinstance(c, dict) else None for c in commands]
        lines = [k.strip() for k in keys if isinstance(k, str) and k.strip()]
        if len(lines) != len(commands):
            return Parsed(error='every command needs non-empty "keystrokes"')
        calls = [Call("bash", command=line) for line in lines]
        if reply.get("task_complete") is True:
            calls.append(Call("submit"))
        return Parsed(calls=tuple(calls)) if calls else Parsed(error="the reply does nothing")

    def _shown(self, call: Call, step: int) -> Action:
        keystrokes = [{"keystrokes": f"{call.command}\n"}] if call.kind == "bash" else []
        reply = {"analysis": "", "commands": keystrokes, "task_complete": call.kind == "submit"}
        return Action(text=json.dumps(reply))

    def observe(self, parsed: Parsed, results: Sequence[CallResult]) -> Observation:
        if parsed.error is not None:
            text = f"Format error: {parsed.error}.\n{EXPECTED}"
            return Observation(text=text, data={"parse_error": parsed.error})
        shown = [f"$ {r.call.command}\n{r.text}" if r.call.command else r.text for r in results]
        return Observation(text="\n\n".join(shown))


if __name__ == "__main__":
    sample = '<think>Look first.</think>{"analysis": "", "commands": [{"keystrokes": "ls\\n"}]}'
    print(JsonProtocol().parse(Action(text=sample, completion=Completion(text=sample))).commands)
