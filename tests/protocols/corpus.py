"""Replies as real OpenAI-compatible servers return them (vLLM with and without a reasoning
parser, gpt-oss's separate reasoning, hermes-style tool calls), for the protocol tests."""

from __future__ import annotations

import json
from typing import Any

from llenvs_async.types import Action, Completion


def reply(
    text: str,
    *,
    reasoning: str | None = None,
    finish_reason: str = "stop",
    tool_calls: tuple[Any, ...] = (),
) -> Action:
    """An action as the runner builds it from a server's completion."""
    completion = Completion(
        text=text, reasoning=reasoning, finish_reason=finish_reason, tool_calls=tool_calls
    )
    return Action(text=text, tool_calls=tool_calls, completion=completion)


def tool_call(name: str, arguments: Any, call_id: str | None = "chatcmpl-tool-0") -> Any:
    """An OpenAI tool call; ``arguments`` a dict is sent as its JSON string, a string as is."""
    args = json.dumps(arguments) if isinstance(arguments, dict) else arguments
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    return call if call_id is None else {"id": call_id, **call}


# Qwen3 (thinking, no reasoning parser): the template opens <think> in the prompt, so the
# completion starts inside the reasoning; a decoy block there must never run.
QWEN3_OPEN_IN_PROMPT = (
    "Okay, the task says to count the rows of data.csv. Maybe I could just delete it:\n\n"
    "```bash\nrm -rf /app\n```\n\n"
    "No, that would destroy the data. Let me look at the file first.\n"
    "</think>\n\n"
    "I'll count the lines of the CSV.\n\n"
    "```bash\nwc -l /app/data.csv\n```"
)

# Qwen3 with both tags in the completion (an older template, or a chat-completions server
# that returns the raw text).
QWEN3_FULL_THINK = (
    "<think>\nThe build failed. Something like\n```\nmake clean\n```\nmight help, but first "
    "I should read the log.\n</think>\n\n"
    "```bash\ntail -n 50 build.log\n```"
)

QWEN3_SUBMIT = (
    "The output matches the expected totals, so the task is complete. I should submit.\n"
    "</think>\n\nSUBMIT"
)

# Cut off by a stop condition other than max_tokens while still reasoning.
QWEN3_UNCLOSED = (
    "<think>\nLet me check the permissions first:\n```bash\nls -l /app\n```\nthen maybe"
)

DEEPSEEK_R1 = (
    "<think>\nWe need the largest file under /var/log. We can use find with -printf "
    "and sort numerically.\n</think>\n\n"
    "To find the largest log file, I'll list files by size:\n\n"
    "```bash\nfind /var/log -type f -printf '%s %p\\n' | sort -rn | head -1\n```\n\n"
    "This prints the size in bytes and the path."
)

GPT_OSS_REASONING = (
    "We need to inspect the CSV header. Use head. Let's do ```bash\ncat /etc/shadow\n``` "
    "no, just head."
)
GPT_OSS_CONTENT = "```bash\nhead -n 5 /app/data.csv\n```"

PROSE_ONLY = "I'll list the files in the current directory to see what we're working with."

TWO_BLOCKS = (
    "First create the directory, then copy the file:\n\n"
    "```bash\nmkdir -p /app/out\n```\n\n"
    "```bash\ncp /app/in.txt /app/out/\n```"
)

EMPTY_BLOCK = "Let me run this:\n\n```bash\n\n```"

SUBMIT_IN_BLOCK = "All tests pass now.\n\n```\nSUBMIT\n```"

MULTILINE_BLOCK = (
    "I'll write the config with a heredoc:\n\n"
    "```sh\ncat > /app/config.ini <<'EOF'\n[server]\nport = 8080\nEOF\n```"
)

CRLF_REPLY = "Making the directory.\r\n\r\n```bash\r\nmkdir -p /app/out\r\ncd /app/out\r\n```\r\n"

# An answer, then more reasoning: only the <think> block is removed.
ANSWER_THEN_THINK = (
    "```bash\nmake test\n```\n<think>That should show the failures.</think>\nRunning it."
)

# Cut off at max_tokens right after a complete block: the reply still runs nothing.
CUT_OFF_AFTER_BLOCK = "```bash\nls -la /app\n```\n\nAfter that, I will open the largest"

PARALLEL_CALLS = (
    tool_call("bash", {"command": "cd /app && ls"}, "chatcmpl-tool-a1"),
    tool_call("bash", {"command": "cat README.md", "timeout_sec": 5}, "chatcmpl-tool-a2"),
    tool_call("submit", {}, "chatcmpl-tool-a3"),
    tool_call("bash", {"command": "rm -rf /app"}, "chatcmpl-tool-a4"),
)

MALFORMED_JSON_CALL = tool_call("bash", '{"command": "ls -la", ', "chatcmpl-tool-b1")
UNKNOWN_TOOL_CALL = tool_call("python", {"code": "print(1)"}, "chatcmpl-tool-b2")
MISSING_COMMAND_CALL = tool_call("bash", {"cmd": "ls"}, "chatcmpl-tool-b3")
BAD_TIMEOUT_CALL = tool_call("bash", {"command": "sleep 1", "timeout_sec": -3}, "b4")
DICT_ARGUMENTS_CALL = {
    "id": "b5",
    "type": "function",
    "function": {"name": "bash", "arguments": {"command": "pwd"}},
}
TOOLS_TEXT_ONLY = "I'll run `ls -la` to see the files.\n\n```bash\nls -la\n```"
