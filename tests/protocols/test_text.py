"""The ``text`` format: one fenced block per reply, reasoning removed first, strict errors."""

from __future__ import annotations

import pytest

from llenvs_async.protocols import (
    PROTOCOLS,
    AgentProtocol,
    Call,
    CallResult,
    Parsed,
    TextProtocol,
    ToolsProtocol,
    get_protocol,
)
from llenvs_async.types import Action
from tests.protocols import corpus
from tests.protocols.corpus import reply

TEXT = TextProtocol()


def bash(command: str) -> Parsed:
    return Parsed(calls=(Call("bash", command=command),))


SUBMIT = Parsed(calls=(Call("submit"),))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (corpus.QWEN3_OPEN_IN_PROMPT, bash("wc -l /app/data.csv")),
        (corpus.QWEN3_FULL_THINK, bash("tail -n 50 build.log")),
        (corpus.QWEN3_SUBMIT, SUBMIT),
        (
            corpus.DEEPSEEK_R1,
            bash("find /var/log -type f -printf '%s %p\\n' | sort -rn | head -1"),
        ),
        (corpus.SUBMIT_IN_BLOCK, SUBMIT),
        (
            corpus.MULTILINE_BLOCK,
            bash("cat > /app/config.ini <<'EOF'\n[server]\nport = 8080\nEOF"),
        ),
        (corpus.CRLF_REPLY, bash("mkdir -p /app/out\ncd /app/out")),
        (corpus.ANSWER_THEN_THINK, bash("make test")),
        ("  SUBMIT\n", SUBMIT),
        ("<think>a</think>mid <think>b</think>\n```\nls\n```", bash("ls")),
        (
            "````markdown\n```bash\nnot a fence end\n```\n````",
            bash("```bash\nnot a fence end\n```"),
        ),
    ],
)
def test_model_replies_parse_to_their_one_command(text: str, expected: Parsed) -> None:
    assert TEXT.parse(reply(text)) == expected


def test_reasoning_field_is_ignored_and_content_runs() -> None:
    action = reply(corpus.GPT_OSS_CONTENT, reasoning=corpus.GPT_OSS_REASONING)
    assert TEXT.parse(action) == bash("head -n 5 /app/data.csv")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (corpus.QWEN3_UNCLOSED, "the reply ended inside <think>: no answer after the reasoning"),
        ("done thinking</think>\n\n<think>more", "ended inside <think>"),
        (corpus.PROSE_ONLY, "no fenced code block, and prose is never run"),
        ("SUBMIT now", "no fenced code block"),
        ("submit", "no fenced code block"),
        (corpus.TWO_BLOCKS, "2 code blocks"),
        (corpus.EMPTY_BLOCK, "code block is empty"),
        ("```bash\nls -la", "never closed"),
        ("```bash\nls\n```\n```bash\npwd", "never closed"),
        ("", "the reply is empty"),
        ("<think>\nthe answer is obvious\n</think>\n\n", "no answer after the reasoning"),
        ("I think we're done.\n</think>", "no answer after the reasoning"),
    ],
)
def test_malformed_replies_are_format_errors(text: str, error: str) -> None:
    parsed = TEXT.parse(reply(text))
    assert parsed.calls == ()
    assert parsed.error is not None and error in parsed.error
    assert parsed.commands == ()


def test_reasoning_only_reply_from_a_reasoning_parser() -> None:
    parsed = TEXT.parse(reply("", reasoning="Let me think about the files."))
    assert parsed.error == "the reply has no answer after the reasoning"


def test_cut_off_reply_runs_nothing_even_with_a_complete_block() -> None:
    action = reply(corpus.CUT_OFF_AFTER_BLOCK, finish_reason="length")
    parsed = TEXT.parse(action)
    assert parsed.calls == () and parsed.error is not None
    assert "max_tokens" in parsed.error
    assert TEXT.commands(action) == ()
    assert TEXT.parse(reply(corpus.CUT_OFF_AFTER_BLOCK)) == bash("ls -la /app")


def test_submit_word_is_configurable() -> None:
    done = TextProtocol(submit_word="DONE")
    assert done.parse(reply("DONE")) == SUBMIT
    assert done.parse(reply("```\nDONE\n```")) == SUBMIT
    assert done.parse(reply("SUBMIT")).error is not None
    assert done.parse(Action(text="SUBMIT")) == bash("SUBMIT")
    assert "DONE alone" in done.instructions()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("apt-get update", bash("apt-get update")),
        ("I'll list the files", bash("I'll list the files")),
        ("  SUBMIT ", SUBMIT),
        ("```bash\nls -la\n```", bash("ls -la")),
        ("```bash\nSUBMIT\n```", SUBMIT),
    ],
)
def test_command_as_written(text: str, expected: Parsed) -> None:
    assert TEXT.parse(Action(text=text)) == expected


def test_empty_command_as_written_is_an_error_and_renders_unchanged() -> None:
    action = Action(text="  ")
    assert TEXT.parse(action).error == "empty command"
    assert TEXT.render(action, 1) is action


@pytest.mark.parametrize(
    "command",
    [
        "apt-get update",
        "cat > f <<'EOF'\n```bash\nmake\n```\nEOF",
        "SUBMIT",
        "printf '```\\n'",
    ],
)
def test_render_of_a_command_as_written_round_trips(command: str) -> None:
    original = Action(text=command)
    shown = TEXT.render(original, 3)
    assert TEXT.parse(shown) == TEXT.parse(original)
    assert TEXT.render(shown, 3) == shown
    if command == "SUBMIT":
        assert shown == Action(text="SUBMIT")
    else:
        assert shown == Action(text=f"```bash\n{command}\n```")
    if "```" not in command:  # as the model would have written it
        assert TEXT.parse(reply(shown.text)) == TEXT.parse(original)


def test_render_leaves_model_output_unchanged() -> None:
    action = reply(corpus.QWEN3_OPEN_IN_PROMPT)
    assert TEXT.render(action, 2) is action


def test_observe_format_error_says_what_and_what_is_expected() -> None:
    parsed = TEXT.parse(reply(corpus.PROSE_ONLY))
    observation = TEXT.observe(parsed, ())
    assert observation.data == {"parse_error": parsed.error}
    first, expected = observation.text.split("\n")
    assert parsed.error is not None and parsed.error in first
    assert "```bash" in expected and "SUBMIT alone" in expected


def test_observe_returns_the_result_text() -> None:
    parsed = bash("ls")
    observation = TEXT.observe(parsed, [CallResult(parsed.calls[0], "a.txt\nb.txt")])
    assert observation.text == "a.txt\nb.txt"
    assert observation.data == {}
    submitted = TEXT.observe(SUBMIT, [CallResult(SUBMIT.calls[0], "Submitted.")])
    assert submitted.text == "Submitted."
    assert TEXT.observe(SUBMIT, ()).text == ""


def test_instructions_explain_the_format() -> None:
    prompt = TEXT.instructions()
    assert "```bash" in prompt and "SUBMIT alone" in prompt
    assert TEXT.tools() == ()


def test_example_turns_are_replies_the_parser_accepts() -> None:
    """Every shown assistant turn parses to a command or a submit under the same rules."""
    turns = TEXT.examples()
    assert [m.role for m in turns] == ["user", "assistant"] * (len(turns) // 2)
    shown = [TEXT.parse(reply(m.content)) for m in turns if m.role == "assistant"]
    assert all(p.error is None for p in shown) and sum(p.submits for p in shown) == 1
    assert TextProtocol(submit_word="DONE").examples()[7].content == "DONE"
    assert TextProtocol(few_shot=False).examples() == () and ToolsProtocol().examples() == ()


def test_get_protocol() -> None:
    assert dict(PROTOCOLS) == {"text": TextProtocol, "tools": ToolsProtocol}
    text = get_protocol("text", submit_word="DONE")
    assert isinstance(text, TextProtocol) and text.submit_word == "DONE"
    assert isinstance(get_protocol("tools"), ToolsProtocol)
    given: AgentProtocol = ToolsProtocol()
    assert get_protocol(given) is given
    with pytest.raises(ValueError, match=r"'json'.*'text', 'tools'"):
        get_protocol("json")
    with pytest.raises(ValueError, match="one non-empty word"):
        get_protocol("text", submit_word="ALL DONE")


def test_generation_stops_where_the_first_block_closes_and_the_reply_still_parses() -> None:
    """The stop string ends a reply after its block; kept in the text, it parses as the
    whole reply would have, and a prose-first bare fence stops unclosed: an error, as ever."""
    (stop,) = TEXT.stop_sequences()
    rambling = "```bash\nwc -l /app/a.log\n```\nThis counts the lines.\n```bash\nls\n```\n"
    stopped = rambling[: rambling.index(stop) + len(stop)]
    assert stopped == "```bash\nwc -l /app/a.log\n```\n"
    assert TEXT.parse(reply(rambling)).error is not None  # two blocks: never run
    assert TEXT.parse(reply(stopped)) == bash("wc -l /app/a.log")
    bare = "Run this:\n```\nls\n```\n"
    assert TEXT.parse(reply(bare[: bare.index(stop) + len(stop)])).error is not None
    assert TextProtocol(stop_after_block=False).stop_sequences() == ()
    assert ToolsProtocol().stop_sequences() == ()
