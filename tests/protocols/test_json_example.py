"""The worked example (examples/json_protocol.py): a user-defined protocol that plugs in."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from llenvs_async.protocols import AgentProtocol, Call, CallResult, get_protocol
from llenvs_async.types import Action
from tests.protocols.corpus import reply

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "json_protocol.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("json_protocol_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def protocol() -> AgentProtocol:
    made = load().JsonProtocol()
    assert isinstance(made, AgentProtocol) and get_protocol(made) is made
    return made


def terminus(*keystrokes: str, done: bool = False) -> str:
    commands = [{"keystrokes": k, "duration": 0.1} for k in keystrokes]
    return json.dumps({"analysis": "a", "plan": "p", "commands": commands, "task_complete": done})


def test_reply_after_reasoning_runs_its_keystrokes_then_submits(protocol: AgentProtocol) -> None:
    decoy, answer = terminus("rm -rf /"), terminus("ls\n", "pwd\n", done=True)
    text = f"<think>Maybe {decoy}? No.</think>\n{answer}"
    parsed = protocol.parse(reply(text))
    assert parsed.calls == (Call("bash", "ls"), Call("bash", "pwd"), Call("submit"))
    assert parsed.commands == ("ls", "pwd") and parsed.submits


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("I'll list the files.", "not a JSON object"),
        ('{"analysis": "x", "commands": "ls"}', 'no "commands" list'),
        (terminus("ls\n", "  "), "non-empty"),
        (terminus(), "does nothing"),
    ],
)
def test_format_errors(protocol: AgentProtocol, text: str, error: str) -> None:
    parsed = protocol.parse(reply(text))
    assert parsed.calls == () and parsed.error is not None and error in parsed.error
    observation = protocol.observe(parsed, ())
    assert observation.data == {"parse_error": parsed.error}
    assert '"keystrokes"' in observation.text


def test_cut_off_reply_runs_nothing(protocol: AgentProtocol) -> None:
    assert protocol.parse(reply(terminus("ls\n"), finish_reason="length")).calls == ()


@pytest.mark.parametrize("text", ["apt-get update", "SUBMIT"])
def test_command_as_written_renders_and_replays(protocol: AgentProtocol, text: str) -> None:
    original = Action(text=text)
    shown = protocol.render(original, 1)
    assert json.loads(shown.text)["task_complete"] is (text == "SUBMIT")
    assert protocol.parse(shown) == protocol.parse(original)


def test_observe_shows_each_command(protocol: AgentProtocol) -> None:
    parsed = protocol.parse(reply(terminus("ls\n", done=True)))
    results = [CallResult(parsed.calls[0], "a.txt"), CallResult(parsed.calls[1], "Submitted.")]
    assert protocol.observe(parsed, results).text == "$ ls\na.txt\n\nSubmitted."
