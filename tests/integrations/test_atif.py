"""ATIF (Harbor's Agent Trajectory Interchange Format): export, view and import.

Tests marked ``standards`` need Harbor's pydantic models (``harbor.models.trajectories``):
skipped locally without them, FAILED in CI. The others exercise our pure ``to_atif`` /
``from_atif`` and the CLI without Harbor installed. The last test runs a real Harbor task
in real containers (``docker``): export, validate, import, then ``q-values`` from the
imported states, for our own trajectories and for one another agent recorded.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import (
    Action,
    Completion,
    EnvError,
    GenerationRequest,
    SamplingParams,
    ScriptedBackend,
    State,
    StepResult,
    Trajectory,
    TrajectoryRunner,
)
from llenvs_async.cli import main
from llenvs_async.cli.atif import import_atif
from llenvs_async.envs import ChainEnv
from llenvs_async.integrations.atif import (
    ATIF_VERSION,
    EXTRA_KEY,
    AtifError,
    find_atif_files,
    from_atif,
    read_atif,
    to_atif,
    validate,
)
from llenvs_async.serialization import read_jsonl, read_trajectories, to_dict
from llenvs_async.testing.chat_tokenizer import ChatMLTokenizer
from llenvs_async.types import Observation, ToolReply, Transition
from llenvs_async.viewer.model import load_files
from tests.cli._docker import docker_ready  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_TASKS = REPO / "examples" / "tasks"
SYSTEM = "Walk right."


class CrashingChain(ChainEnv):
    """``ChainEnv`` whose step fails on the action ``crash`` (a failed rollout)."""

    async def _step(self, state: State, action: Action) -> StepResult:
        if action.text == "crash":
            raise EnvError("boom", position=state.step)
        return await super()._step(state, action)


def _policy(tok: ChatMLTokenizer) -> Any:
    """Rollout 0 walks right; rollout 1 steps left first; rollout 2 crashes at step 1.
    Token ids, logprobs -0.25 each, and a reasoning text per reply."""

    def policy(request: GenerationRequest) -> Completion:
        words = {0: "right", 1: "left" if request.step == 0 else "right"}
        text = words.get(request.rollout_index, "right" if request.step == 0 else "crash")
        ids = tok.encode(text)
        return Completion(
            text=text,
            token_ids=tuple(ids),
            logprobs=tuple(-0.25 for _ in ids),
            finish_reason="stop",
            prompt_token_ids=request.prompt_token_ids or (),
            reasoning=f"step {request.step}: go {text}",
        )

    return policy


def _runner() -> TrajectoryRunner:
    tok = ChatMLTokenizer()
    return TrajectoryRunner(
        CrashingChain(min_length=2, max_steps=4),
        ScriptedBackend(_policy(tok), tokenizer=tok),
        SamplingParams(max_tokens=8),
        system_prompt=SYSTEM,
        token_mode=True,
    )


@pytest.fixture(scope="module")
def rollouts() -> dict[str, Trajectory]:
    """Token-mode rollouts: a success, a detour, a failure, a rollout from a restored
    mid-trajectory state, and one whose first action was forced."""

    async def collect() -> dict[str, Trajectory]:
        runner = _runner()
        ok, detour, failed = await runner.run_batch([0, 0, 0])
        (restored,) = await runner.run_batch_from_states([detour.transitions[1].state])
        (forced,) = await runner.run_batch_from_state_actions(
            [ok.initial_state], [Action(text="right")]
        )
        return {
            "ok": ok,
            "detour": detour,
            "failed": failed,
            "restored": restored,
            "forced": forced,
        }

    return asyncio.run(collect())


def _round_trip(trajectory: Trajectory, **kwargs: Any) -> tuple[dict[str, Any], Trajectory]:
    document = json.loads(json.dumps(to_atif(trajectory, **kwargs)))  # through JSON text
    return document, from_atif(document)


# -- pure: our documents ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ok", "detour", "failed", "restored", "forced"])
def test_our_documents_come_back_exactly(rollouts: dict[str, Trajectory], name: str) -> None:
    trajectory = rollouts[name]
    _, back = _round_trip(trajectory, system_prompt=SYSTEM)
    assert to_dict(back) == to_dict(trajectory)
    assert back.token_record() == trajectory.token_record()
    assert back.token_record() is not None
    assert [s.hidden for s in back.states] == [s.hidden for s in trajectory.states]


def test_tool_replies_come_back_whether_or_not_the_results_name_their_calls() -> None:
    """Replies to the step's own calls travel as ATIF results (``source_call_id``); one that
    answers no call of its step (a format error's reply) travels in our extra."""
    call = {"id": "c1", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": "ls"})}}  # fmt: skip
    start = State(observation=Observation(text="task"), task="t", episode_id="e")
    answered = Observation(
        text="[bash: ls]\na", tool_replies=(ToolReply(tool_call_id="c1", content="a"),)
    )
    stray = Observation(text="bad", tool_replies=(ToolReply(tool_call_id="zz", content="bad"),))
    first = Action(text="", tool_calls=(call,))
    one = start.advance(first, answered)
    two = one.advance(Action(text="??"), stray, terminated=True)
    trajectory = Trajectory(
        episode_id="e", initial_state=start, stop_reason="terminated",
        transitions=(Transition(state=start, action=first, next_state=one),
                     Transition(state=one, action=Action(text="??"), next_state=two, reward=1.0)),
    )  # fmt: skip
    document, back = _round_trip(trajectory)
    results = [step.get("observation", {}).get("results") for step in document["steps"]]
    assert {"content": "a", "source_call_id": "c1"} in [r for rs in results if rs for r in rs]
    assert [t.next_state.observation for t in back.transitions] == [answered, stray]


def test_the_atif_fields_carry_messages_reasoning_tokens_and_rewards(
    rollouts: dict[str, Trajectory],
) -> None:
    trajectory = rollouts["detour"]
    document, _ = _round_trip(trajectory, system_prompt=SYSTEM, model_name="tiny")
    assert document["schema_version"] == ATIF_VERSION
    assert document["agent"]["model_name"] == "tiny"
    system, user, *agent = document["steps"]
    assert [s["step_id"] for s in document["steps"]] == list(range(1, 3 + len(trajectory)))
    assert (system["source"], system["message"]) == ("system", SYSTEM)
    assert user == {
        "step_id": 2,
        "source": "user",
        "message": trajectory.initial_state.observation.text,
        "extra": {EXTRA_KEY: {"data": {"position": 0}}},
    }
    record = trajectory.token_record()
    assert record is not None
    for step, t, (start, end) in zip(agent, trajectory.transitions, record.turns, strict=True):
        assert t.completion is not None
        assert step["message"] == t.action.text
        assert step["reasoning_content"] == t.completion.reasoning
        assert step["metrics"]["completion_token_ids"] == list(record.input_ids[start:end])
        assert step["metrics"]["prompt_token_ids"] == list(record.input_ids[:start])
        assert step["metrics"]["logprobs"] == [-0.25] * (end - start)
        assert step["observation"]["results"] == [{"content": t.next_state.observation.text}]
        assert step["extra"][EXTRA_KEY]["reward"] == t.reward
    assert document["extra"][EXTRA_KEY]["total_reward"] == trajectory.total_reward == 1.0
    assert document["final_metrics"]["total_steps"] == len(document["steps"])


def test_a_failure_is_kept_and_a_restored_prefix_is_copied_context(
    rollouts: dict[str, Trajectory],
) -> None:
    failed, _ = _round_trip(rollouts["failed"])
    error = failed["extra"][EXTRA_KEY]["error"]
    assert (error["type"], error["message"]) == ("EnvError", "boom")
    assert failed["extra"][EXTRA_KEY]["stop_reason"] == "error"
    restored = rollouts["restored"]
    document, back = _round_trip(restored)
    copied = [s for s in document["steps"] if s.get("is_copied_context")]
    assert [s["message"] for s in copied] == [a.text for a in restored.initial_state.actions]
    assert len(copied) == restored.initial_state.step == 1
    assert back.initial_state.history == restored.initial_state.history
    forced, _ = _round_trip(rollouts["forced"])
    first = forced["steps"][1]
    assert first["extra"][EXTRA_KEY]["forced"] is True and "metrics" not in first


# -- pure: other agents' documents ---------------------------------------------------------


def _terminus_like() -> dict[str, Any]:
    """What Harbor's Terminus 2 writes: keystroke tool calls, a step that runs nothing, and
    ``mark_task_complete`` (asked twice) at the end."""

    def agent(step_id: int, message: str, calls: list[dict[str, Any]], output: str | None):
        step: dict[str, Any] = {
            "step_id": step_id,
            "source": "agent",
            "message": message,
            "tool_calls": calls or None,
            "metrics": {"prompt_tokens": 10, "completion_tokens": 3},
        }
        if output is not None:
            step["observation"] = {"results": [{"content": output}]}
        return step

    def keys(step: int, text: str) -> dict[str, Any]:
        return {
            "tool_call_id": f"call_{step}_1",
            "function_name": "bash_command",
            "arguments": {"keystrokes": text + "\n", "duration": 0.1},
        }

    done = [{"tool_call_id": "call_done", "function_name": "mark_task_complete", "arguments": {}}]
    return {
        "schema_version": "ATIF-v1.4",
        "session_id": "sess-1",
        "agent": {"name": "terminus-2", "version": "2.0"},
        "steps": [
            {"step_id": 1, "source": "system", "message": "You are an agent."},
            {"step_id": 2, "source": "user", "message": "Make /app/x hold 1."},
            agent(3, "I will look first.", [keys(3, "ls /app")], "y z"),
            agent(4, "Thinking...", [], None),
            agent(5, "Write it.", [keys(5, "echo 1 > /app/x")], ""),
            {"step_id": 6, "source": "user", "message": "Are you sure?"},
            agent(7, "Done.", done, "confirm?"),
            agent(8, "Yes, done.", done, ""),
        ],
    }


def test_another_agents_steps_become_replayable_commands() -> None:
    hidden = {"task_name": "t", "task_index": 0}
    trajectory = from_atif(_terminus_like(), task="t", hidden=hidden)
    assert [a.text for a in trajectory.actions] == ["ls /app", "echo 1 > /app/x", "SUBMIT"]
    assert all(a.completion is None for a in trajectory.actions)  # replayed as written
    assert [t.info["command"] for t in trajectory.transitions][:2] == ["ls /app", "echo 1 > /app/x"]
    first, second, last = trajectory.transitions
    assert first.completion is not None and first.completion.text == "I will look first."
    assert first.next_state.observation.text == "y z"
    assert second.info["atif_context"] == [{"step_id": 4, "message": "Thinking..."}]
    assert second.next_state.observation.text == "Are you sure?"
    assert "submitted" not in last.state.info and last.info["submitted"] is True
    assert trajectory.final_state.terminated and trajectory.stop_reason == "terminated"
    assert trajectory.info["system_prompt"] == "You are an agent."
    assert trajectory.initial_state.observation.text == "Make /app/x hold 1."
    assert all(s.task == "t" and s.hidden == hidden for s in trajectory.states)
    mid = trajectory.transitions[1].state
    assert mid.step == 1 and [a.text for a in mid.actions] == ["ls /app"] and not mid.done


def test_a_call_that_is_not_a_shell_command_is_refused_unless_skipped() -> None:
    document = _terminus_like()
    document["steps"][2]["tool_calls"].append(
        {"tool_call_id": "e1", "function_name": "Edit", "arguments": {"file_path": "/app/x"}}
    )
    with pytest.raises(AtifError, match=r"step_id=3.*'Edit'.*skip_unknown_tools") as info:
        from_atif(document)
    assert info.value.details["value"] == "Edit" and info.value.details["step_id"] == 3
    skipped = from_atif(document, skip_unknown_tools=True)
    assert skipped.transitions[0].info["atif_ignored_calls"] == ["Edit"]
    assert skipped.actions[0].text == "ls /app"


def test_bad_documents_name_the_field() -> None:
    with pytest.raises(AtifError, match="schema_version=None") as info:
        from_atif({"steps": []})
    assert info.value.details["field"] == "schema_version"
    bad = _terminus_like()
    bad["steps"][1]["source"] = "robot"
    with pytest.raises(AtifError, match=r"steps\[1\]\.source.*'robot'"):
        from_atif(bad)


# -- pure: the CLI --------------------------------------------------------------------------


def test_export_view_and_import_atif_from_the_cli(tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    assert (
        main(["run", "--env", "chain", "-t", "0", "-t", "1", "-n", "2", "-o", str(results), "-q"])
        == 0
    )
    out = tmp_path / "atif"
    assert main(["export", str(results), "--format", "atif", "-o", str(out)]) == 0
    files = find_atif_files(out)
    assert [f.relative_to(out).as_posix() for f in files] == [
        f"{t}__{r}/agent/trajectory.json" for t in (0, 1) for r in (0, 1)
    ]
    document, _ = load_files([out])
    assert len(document["runs"]) == 4 and document["files"][0]["kind"] == "atif"
    assert sorted((r["task"], r["rollout"]) for r in document["runs"]) == [
        (t, r) for t in (0, 1) for r in (0, 1)
    ]
    imported = tmp_path / "back.jsonl"
    import_atif([out], imported)
    assert [to_dict(t) for t in read_trajectories(imported)] == [
        to_dict(t) for t in read_trajectories(results)
    ]
    assert [r["source"] for r in read_jsonl(imported)] == [r["source"] for r in read_jsonl(results)]
    assert (
        main(
            [
                "q-values",
                str(imported),
                "-n",
                "2",
                "--max-states",
                "1",
                "--json",
                str(tmp_path / "q.json"),
            ]
        )
        == 0
    )
    rows = json.loads((tmp_path / "q.json").read_text())
    assert rows[0]["kind"] == "V" and rows[0]["n"] == 2


# -- standards: Harbor's own models ---------------------------------------------------------


@pytest.mark.standards
@pytest.mark.parametrize("name", ["ok", "detour", "failed", "restored", "forced"])
def test_every_document_we_write_validates_with_harbors_models(
    rollouts: dict[str, Trajectory], name: str
) -> None:
    pytest.importorskip("harbor.models.trajectories")
    document = to_atif(rollouts[name], system_prompt=SYSTEM, model_name="tiny")
    model = validate(document)
    assert model.schema_version == ATIF_VERSION
    assert model.to_json_dict() == json.loads(json.dumps(document))  # nothing dropped
    broken = {**document, "steps": [{**document["steps"][0], "step_id": 5}]}
    with pytest.raises(AtifError, match="step_id"):
        validate(broken)


@pytest.mark.standards
def test_a_document_built_with_harbors_models_imports() -> None:
    models = pytest.importorskip("harbor.models.trajectories")
    steps = [
        models.Step(step_id=1, source="user", message="Count the files."),
        models.Step(
            step_id=2,
            source="agent",
            message="Listing.",
            reasoning_content="ls is enough",
            tool_calls=[
                models.ToolCall(
                    tool_call_id="c1",
                    function_name="exec_command",
                    arguments={"cmd": ["bash", "-lc", "ls | wc -l"]},
                )
            ],
            observation=models.Observation(
                results=[models.ObservationResult(source_call_id="c1", content="3")]
            ),
            metrics=models.Metrics(
                prompt_tokens=4,
                completion_tokens=2,
                prompt_token_ids=[1, 2, 3, 4],
                completion_token_ids=[7, 8],
                logprobs=[-0.1, -0.2],
            ),
        ),
    ]
    document = models.Trajectory(
        schema_version="ATIF-v1.5",
        session_id="s",
        agent=models.Agent(name="codex", version="1"),
        steps=steps,
    ).to_json_dict()
    (t,) = from_atif(document, task="count").transitions
    assert t.action.text == "ls | wc -l" and t.next_state.observation.text == "3"
    assert t.completion is not None
    assert (t.completion.token_ids, t.completion.prompt_token_ids) == ((7, 8), (1, 2, 3, 4))
    assert t.completion.logprobs == (-0.1, -0.2) and t.completion.reasoning == "ls is enough"


# -- standards + docker: a real Harbor task -------------------------------------------------


@pytest.mark.standards
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("docker_ready")
def test_harbor_task_trajectories_round_trip_into_q_values(tmp_path: Path) -> None:
    models = pytest.importorskip("harbor.models.trajectories")
    results = tmp_path / "run.jsonl"
    assert (
        main(["run", str(EXAMPLE_TASKS), "-t", "csv-totals", "-n", "1", "-o", str(results), "-q"])
        == 0
    )
    out = tmp_path / "atif"
    assert main(["export", str(results), "--format", "atif", "-o", str(out)]) == 0
    (ours,) = find_atif_files(out)
    models.Trajectory.model_validate(read_atif(ours))
    # Another agent's recording of the same task: the solution as Terminus keystrokes.
    solution = (EXAMPLE_TASKS / "csv-totals" / "solution" / "solve.sh").read_text()
    lines = [ln for ln in solution.splitlines() if ln.strip() and not ln.startswith("#")]
    steps = [models.Step(step_id=1, source="user", message="Aggregate the CSV.")]
    for i, line in enumerate(lines, start=2):
        call = models.ToolCall(
            tool_call_id=f"k{i}",
            function_name="bash_command",
            arguments={"keystrokes": line + "\n", "duration": 1},
        )
        steps.append(
            models.Step(
                step_id=i,
                source="agent",
                message=f"run {i}",
                tool_calls=[call],
                observation=models.Observation(
                    results=[models.ObservationResult(source_call_id=f"k{i}", content="")]
                ),
            )
        )
    trial = tmp_path / "foreign" / "csv-totals__1" / "agent"
    trial.mkdir(parents=True)
    recorded = models.Trajectory(agent=models.Agent(name="terminus-2", version="2"), steps=steps)
    (trial / "trajectory.json").write_text(json.dumps(recorded.to_json_dict()))
    foreign = {"dataset": str(EXAMPLE_TASKS), "task": "csv-totals"}
    for source, flags in ((out, {}), (tmp_path / "foreign", foreign)):
        imported = tmp_path / f"{source.name}.jsonl"
        import_atif([source], imported, **flags)
        (trajectory,) = read_trajectories(imported)
        assert trajectory.initial_state.hidden["task_name"] == "llenvs-examples/csv-totals"
        estimates = tmp_path / f"{source.name}.q.json"
        wipe = "rm -rf /app/*"
        assert (
            main(
                [
                    "q-values",
                    str(imported),
                    "-a",
                    wipe,
                    "--step",
                    "1",
                    "-n",
                    "2",
                    "--json",
                    str(estimates),
                ]
            )
            == 0
        )
        rows = {r["action"]: r for r in json.loads(estimates.read_text())}
        assert rows[None]["mean"] == 1.0 and rows[None]["n"] == 2  # the oracle finishes it
        assert rows[wipe]["mean"] == 0.0 and rows[wipe]["n"] == 2
        assert rows[None]["step"] == 1
