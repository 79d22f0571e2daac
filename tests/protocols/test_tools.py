"""The ``tools`` format: ``bash`` and ``submit`` calls, each answered by its id."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from llenvs_async.protocols import Call, CallResult, Parsed, ToolsProtocol
from llenvs_async.types import Action, ToolReply
from tests.protocols import corpus
from tests.protocols.corpus import reply, tool_call

TOOLS = ToolsProtocol()


def calls(*tool_calls: Any, finish_reason: str = "stop") -> Parsed:
    return TOOLS.parse(reply("", tool_calls=tool_calls, finish_reason=finish_reason))


def test_schemas() -> None:
    bash, submit = TOOLS.tools()
    assert bash["type"] == "function" and submit["type"] == "function"
    assert bash["function"]["name"] == "bash"
    params = bash["function"]["parameters"]
    assert params["required"] == ["command"]
    assert params["properties"]["command"]["type"] == "string"
    assert params["properties"]["timeout_sec"]["type"] == "number"
    assert "capped by the task" in params["properties"]["timeout_sec"]["description"]
    assert submit["function"]["name"] == "submit"
    assert submit["function"]["parameters"]["properties"] == {}
    json.dumps(TOOLS.tools())  # what a backend sends
    bash["function"]["name"] = "changed"
    assert TOOLS.tools()[0]["function"]["name"] == "bash"


def test_parallel_calls_run_in_order_until_the_submit() -> None:
    parsed = calls(*corpus.PARALLEL_CALLS)
    assert parsed.error is None
    assert parsed.calls == (
        Call("bash", "cd /app && ls", None, "chatcmpl-tool-a1"),
        Call("bash", "cat README.md", 5.0, "chatcmpl-tool-a2"),
        Call("submit", call_id="chatcmpl-tool-a3"),
        Call("bash", "rm -rf /app", None, "chatcmpl-tool-a4"),
    )
    assert parsed.commands == ("cd /app && ls", "cat README.md")
    assert parsed.submits


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (corpus.MALFORMED_JSON_CALL, "bash: the arguments are not valid JSON"),
        (tool_call("bash", '["ls"]'), "bash: the arguments must be a JSON object, got list"),
        (corpus.UNKNOWN_TOOL_CALL, "unknown tool 'python'; the tools are bash and submit"),
        ({"id": "x", "type": "function", "function": {"arguments": "{}"}}, "names no function"),
        (corpus.MISSING_COMMAND_CALL, "bash: unexpected arguments ['cmd']"),
        (tool_call("bash", {}), "bash: the command argument is missing"),
        (tool_call("bash", {"command": "  "}), "bash: command is empty"),
        (tool_call("bash", {"command": ["ls"]}), "bash: command must be a string, got list"),
        (corpus.BAD_TIMEOUT_CALL, "bash: timeout_sec must be a positive number of seconds, got -3"),
        (tool_call("bash", {"command": "ls", "timeout_sec": True}), "timeout_sec must be"),
        (tool_call("bash", {"command": "ls", "timeout_sec": "10"}), "timeout_sec must be"),
        (tool_call("bash", '{"command": "ls", "timeout_sec": NaN}'), "timeout_sec must be"),
        (tool_call("bash", '{"command": "ls", "timeout_sec": Infinity}'), "timeout_sec must be"),
        (tool_call("submit", {"answer": "42"}), "submit: takes no arguments, got ['answer']"),
    ],
)
def test_malformed_calls_are_invalid_with_a_specific_error(raw: Any, error: str) -> None:
    parsed = calls(tool_call("bash", {"command": "pwd"}, "first"), raw)
    assert parsed.error is None
    assert parsed.calls[0] == Call("bash", "pwd", None, "first")
    invalid = parsed.calls[1]
    assert invalid.kind == "invalid" and invalid.call_id == raw.get("id")
    assert invalid.error is not None and error in invalid.error
    assert parsed.commands == ("pwd",)


def test_tolerated_shapes() -> None:
    assert calls(corpus.DICT_ARGUMENTS_CALL).calls == (Call("bash", "pwd", None, "b5"),)
    for empty in ("", None, "{}"):
        assert calls(tool_call("submit", empty, "s")).calls == (Call("submit", call_id="s"),)
    with_null = tool_call("bash", {"command": "ls\n", "timeout_sec": None}, "n")
    assert calls(with_null).calls == (Call("bash", "ls", None, "n"),)
    sdk_object = SimpleNamespace(
        id="o1", function=SimpleNamespace(name="bash", arguments='{"command": "id"}')
    )
    assert calls(sdk_object).calls == (Call("bash", "id", None, "o1"),)


def test_calls_without_an_id_get_a_deterministic_one() -> None:
    parsed = calls(tool_call("bash", {"command": "ls"}, None), tool_call("submit", {}, None))
    assert [c.call_id for c in parsed.calls] == ["call_0", "call_1"]
    assert parsed == calls(
        tool_call("bash", {"command": "ls"}, None), tool_call("submit", {}, None)
    )


def test_no_tool_call_is_a_format_error_whatever_the_text_says() -> None:
    for text in (corpus.TOOLS_TEXT_ONLY, "SUBMIT", ""):
        parsed = TOOLS.parse(reply(text))
        assert parsed == Parsed(error="the reply called no tool; call bash or submit")


def test_cut_off_reply_runs_nothing_and_answers_its_calls() -> None:
    cut = reply("", tool_calls=corpus.PARALLEL_CALLS[:2], finish_reason="length")
    parsed = TOOLS.parse(cut)
    assert parsed.error is not None and "max_tokens" in parsed.error
    assert parsed.commands == () and not parsed.submits
    assert [c.kind for c in parsed.calls] == ["invalid", "invalid"]
    observation = TOOLS.observe(parsed, ())
    assert observation.data["parse_error"] == parsed.error
    replies = observation.tool_replies
    assert [r.tool_call_id for r in replies] == ["chatcmpl-tool-a1", "chatcmpl-tool-a2"]
    assert all(parsed.error in r.content for r in replies)
    assert TOOLS.parse(reply("```bash\nls\n```", finish_reason="length")).calls == ()


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("apt-get update", Call("bash", "apt-get update")),
        ("  SUBMIT\n", Call("submit")),
        (
            'cat <<\'EOF\' > a.json\n{"k": "v"}\nEOF',
            Call("bash", 'cat <<\'EOF\' > a.json\n{"k": "v"}\nEOF'),
        ),
    ],
)
def test_command_as_written_renders_as_a_call_that_parses_the_same(
    text: str, written: Call
) -> None:
    original = Action(text=text)
    assert TOOLS.parse(original).calls == (written,)
    shown = TOOLS.render(original, 4)
    assert shown.text == ""
    (raw,) = shown.tool_calls
    assert raw["id"] == "call_4_0" and raw["type"] == "function"
    assert raw["function"]["name"] == written.kind
    assert json.loads(raw["function"]["arguments"]) == (
        {} if written.kind == "submit" else {"command": written.command}
    )
    assert TOOLS.parse(shown).calls == (replace(written, call_id="call_4_0"),)
    assert TOOLS.render(shown, 9) is shown


def test_render_leaves_model_output_unchanged() -> None:
    action = reply("", tool_calls=corpus.PARALLEL_CALLS)
    assert TOOLS.render(action, 1) is action
    empty = Action(text="")
    assert TOOLS.render(empty, 1) is empty


def test_observe_answers_every_call_in_order() -> None:
    parsed = calls(*corpus.PARALLEL_CALLS, corpus.UNKNOWN_TOOL_CALL)
    texts = ["a.txt", "# readme", "Submitted.", "(not run)", "[error: unknown tool]"]
    results = [CallResult(c, t) for c, t in zip(parsed.calls, texts, strict=True)]
    observation = TOOLS.observe(parsed, results)
    assert "parse_error" not in observation.data
    pairs = zip(parsed.calls, texts, strict=True)
    assert observation.tool_replies == tuple(
        ToolReply(tool_call_id=c.call_id, content=t) for c, t in pairs
    )
    assert observation.text == (
        "[bash: cd /app && ls]\na.txt\n\n[bash: cat README.md]\n# readme\n\n"
        "[submit]\nSubmitted.\n\n[bash: rm -rf /app]\n(not run)\n\n"
        "[invalid]\n[error: unknown tool]"
    )


def test_observe_format_error() -> None:
    parsed = TOOLS.parse(reply(corpus.TOOLS_TEXT_ONLY))
    observation = TOOLS.observe(parsed, ())
    assert observation.data == {"parse_error": parsed.error}
    first, expected = observation.text.split("\n")
    assert parsed.error is not None and parsed.error in first
    assert "bash tool" in expected and "submit tool" in expected


def test_instructions_name_both_tools() -> None:
    prompt = TOOLS.instructions()
    assert "bash" in prompt and "submit" in prompt and "timeout_sec" in prompt
