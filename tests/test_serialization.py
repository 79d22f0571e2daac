from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llenvs_async import (
    Action,
    Completion,
    ErrorInfo,
    Observation,
    ScriptedBackend,
    State,
    Trajectory,
    TrajectoryRunner,
    Transition,
)
from llenvs_async.envs import ChainEnv
from llenvs_async.serialization import (
    JsonlWriter,
    SerializationError,
    from_dict,
    read_jsonl,
    read_trajectories,
    to_dict,
)
from llenvs_async.types import ToolReply

# -- strategies ---------------------------------------------------------------------------

finite = st.floats(allow_nan=False)
scalars = st.none() | st.booleans() | st.integers() | finite | st.text(max_size=8)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=5).filter(lambda k: k != "__tuple__"), inner, max_size=3)
    ),
    max_leaves=8,
)
mappings = st.dictionaries(
    st.text(max_size=5).filter(lambda k: k != "__tuple__"), json_values, max_size=3
)
actions = st.builds(
    Action, text=st.text(max_size=10), tool_calls=st.lists(json_values, max_size=2).map(tuple)
)
replies = st.builds(ToolReply, tool_call_id=st.text(max_size=5), content=st.text(max_size=10))
observations = st.builds(
    Observation,
    text=st.text(max_size=10),
    data=mappings,
    tool_replies=st.lists(replies, max_size=3).map(tuple),
)
completions = st.builds(
    Completion,
    text=st.text(max_size=10),
    token_ids=st.lists(st.integers(), max_size=4).map(tuple),
    logprobs=st.none() | st.lists(st.floats(allow_nan=False), max_size=4).map(tuple),
    finish_reason=st.none() | st.sampled_from(["stop", "length"]),
    prompt_token_ids=st.lists(st.integers(0, 50_000), max_size=4).map(tuple),
)
errors = st.builds(
    ErrorInfo, type=st.text(max_size=6), message=st.text(max_size=10), phase=st.text(max_size=6)
)


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    state = State(
        observation=draw(observations),
        task=draw(st.none() | st.integers() | st.text(max_size=6)),
        episode_id=draw(st.text(max_size=6)),
        actions=tuple(draw(st.lists(actions, max_size=2))),
        hidden=draw(json_values),
        info=draw(mappings),
        seed=draw(st.none() | st.integers()),
    )
    initial = state
    steps = []
    for _ in range(draw(st.integers(0, 4))):
        action = draw(actions)
        # Mostly a growing prefix; sometimes a state that is not the previous next_state.
        start = state if draw(st.booleans()) or not steps else State(observation=draw(observations))
        nxt = State(
            observation=draw(observations),
            task=start.task,
            step=start.step + 1,
            episode_id=start.episode_id,
            actions=(*start.actions, action) if draw(st.booleans()) else (action,),
            terminated=draw(st.booleans()),
            truncated=draw(st.booleans()),
            hidden=draw(json_values),
        )
        steps.append(
            Transition(
                state=start,
                action=action,
                next_state=nxt,
                reward=draw(finite),
                completion=draw(st.none() | completions),
                info=draw(mappings),
            )
        )
        state = nxt
    return Trajectory(
        episode_id=draw(st.text(max_size=6)),
        initial_state=initial,
        transitions=tuple(steps),
        error=draw(st.none() | errors),
        index=draw(st.none() | st.integers(0, 100)),
        stop_reason=draw(st.sampled_from(["terminated", "truncated", "max_steps", "error"])),
        info=draw(mappings),
    )


def _through_json(obj: Any) -> Any:
    data = to_dict(obj)
    return from_dict(type(obj), json.loads(json.dumps(data)))


# -- round trips ---------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(trajectories())
def test_trajectory_round_trip_is_exact(traj: Trajectory) -> None:
    back = _through_json(traj)
    assert back == traj
    for a, b in zip(back.states, traj.states, strict=True):
        assert type(a.hidden) is type(b.hidden)
        assert a.actions == b.actions
        assert a.history == b.history


@settings(max_examples=60, deadline=None)
@given(st.one_of(actions, observations, completions, errors))
def test_leaf_types_round_trip(obj: Any) -> None:
    assert _through_json(obj) == obj


@settings(max_examples=40, deadline=None)
@given(trajectories())
def test_standalone_transition_and_state_round_trip(traj: Trajectory) -> None:
    assert _through_json(traj.initial_state) == traj.initial_state
    for t in traj.transitions:
        assert _through_json(t) == t


def test_tuples_come_back_as_tuples() -> None:
    state = State(observation=Observation(text="x"), hidden={"pos": (1, (2, [3]))})
    back = _through_json(state)
    assert back.hidden == {"pos": (1, (2, [3]))}
    assert isinstance(back.hidden["pos"], tuple)
    assert isinstance(back.hidden["pos"][1][1], list)


def test_token_ids_and_logprobs_survive() -> None:
    c = Completion(text="hi", token_ids=(5, 6), logprobs=(-0.25, -math.inf), prompt_token_ids=(1,))
    back = _through_json(c)
    assert back.token_ids == (5, 6)
    assert back.logprobs == (-0.25, -math.inf)
    assert back.prompt_token_ids == (1,)


def test_policy_versions_and_spans_survive() -> None:
    c = Completion(
        text="hi", token_ids=(5, 6, 7), policy_version=2, version_spans=((1, 0, 2), (2, 2, 3))
    )
    back = _through_json(c)
    assert back == c and back.policy_versions == (1, 2)
    plain = to_dict(Completion(text="x"))
    assert "policy_version" not in plain and "version_spans" not in plain  # old files unchanged
    assert from_dict(Completion, plain).policy_version is None
    with pytest.raises(SerializationError, match=r"version_spans\[0\]"):
        from_dict(Completion, {"text": "x", "version_spans": [[1, 0]]})
    with pytest.raises(SerializationError, match="policy_version"):
        from_dict(Completion, {"text": "x", "policy_version": "1"})


async def test_real_runner_trajectories_round_trip_and_share_states() -> None:
    env = ChainEnv(num_tasks=2, max_steps=6)
    runner = TrajectoryRunner(
        env, ScriptedBackend(lambda r: Completion(text="right", token_ids=(1,), logprobs=(-0.1,)))
    )
    trajs = await runner.run_batch([0, 1])
    for traj in trajs:
        back = _through_json(traj)
        assert back == traj
        assert back.success
        # Consecutive transitions share one decoded state object (memory stays O(steps)).
        for prev, cur in zip(back.transitions, back.transitions[1:], strict=False):
            assert cur.state is prev.next_state


async def test_history_round_trips_with_completions_and_shares_structure() -> None:
    env = ChainEnv(num_tasks=1, max_steps=6)
    completion = Completion(text="right", token_ids=(7, 8), logprobs=(-0.5, -0.25))
    runner = TrajectoryRunner(env, ScriptedBackend(lambda r: completion))
    [traj] = await runner.run_batch([0])
    completion = dataclasses.replace(completion, policy_version=0)  # the backend's tag
    final = traj.final_state
    assert final.history.complete and len(final.history) == len(traj) > 1
    assert [s.completion for s in final.history] == [completion] * len(traj)
    back = _through_json(traj)
    assert back.final_state.history == final.history
    assert [s.completion for s in back.final_state.history] == [completion] * len(traj)
    # decoded histories share structure: each next_state extends its state's history
    for t in back.transitions:
        assert t.next_state.history.extends(t.state.history)
        assert t.action.completion == completion
    # and a trajectory that starts mid-way keeps the full saved history
    [later] = await runner.run_batch_from_states([traj.states[2]])
    again = _through_json(later)
    assert again.initial_state.history == traj.states[2].history
    assert len(again.final_state.history) == len(later.final_state.history)


def test_tool_replies_written_in_data_before_they_were_typed_still_read() -> None:
    old = {"text": "t", "data": {"parse_error": "x", "tool_replies": [
        {"tool_call_id": "c1", "content": "out"}]}}  # fmt: skip
    observation = from_dict(Observation, old)
    assert observation.tool_replies == (ToolReply(tool_call_id="c1", content="out"),)
    assert dict(observation.data) == {"parse_error": "x"}
    with pytest.raises(SerializationError, match=r"Observation.tool_replies\[0\].content"):
        from_dict(Observation, {"text": "t", "tool_replies": [{"tool_call_id": "c", "content": 1}]})


def test_format_1_files_still_read() -> None:
    old = {
        "format": 1,
        "episode_id": "e",
        "initial_state": {
            "observation": {"text": "o"}, "task": 0, "step": 0, "episode_id": "e",
            "terminated": False, "truncated": False, "hidden": None, "seed": None, "actions": [],
        },
        "transitions": [
            {
                "action": {"text": "a"},
                "next_state": {
                    "observation": {"text": "p"}, "task": 0, "step": 1, "episode_id": "e",
                    "terminated": True, "truncated": False, "hidden": None, "seed": None,
                    "actions_extend": [{"text": "a"}],
                },
                "reward": 1.0,
                "completion": None,
            }
        ],
        "error": None,
        "index": 0,
        "stop_reason": "terminated",
    }  # fmt: skip
    traj = from_dict(Trajectory, old)
    assert traj.final_state.actions == (Action(text="a"),)
    assert traj.total_reward == 1.0


def test_file_size_grows_linearly_with_steps() -> None:
    def traj_of(n: int) -> Trajectory:
        state = State(observation=Observation(text="o"))
        steps = []
        for i in range(n):
            nxt = State(
                observation=Observation(text="o"),
                step=i + 1,
                actions=(*state.actions, Action(text="a" * 50)),
            )
            steps.append(Transition(state=state, action=Action(text="a" * 50), next_state=nxt))
            state = nxt
        return Trajectory(episode_id="e", initial_state=steps[0].state, transitions=tuple(steps))

    small, big = (len(json.dumps(to_dict(traj_of(n)))) for n in (20, 80))
    assert big < 4.5 * small  # quadratic would be ~16x


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hidden", "fragment"),
    [
        ({1, 2}, "set"),
        ({"a": object()}, "State.hidden['a']"),
        ({1: "x"}, "JSON keys are strings"),
        ({"__tuple__": 1}, "reserved"),
    ],
)
def test_non_json_hidden_is_a_clear_error(hidden: Any, fragment: str) -> None:
    with pytest.raises(SerializationError, match=r"State\.hidden") as info:
        to_dict(State(observation=Observation(text="x"), hidden=hidden))
    assert fragment in str(info.value)


def test_malformed_documents_name_the_field() -> None:
    good = to_dict(State(observation=Observation(text="x"), step=2))
    with pytest.raises(SerializationError, match="missing field 'step'"):
        from_dict(State, {k: v for k, v in good.items() if k != "step"})
    with pytest.raises(SerializationError, match=r"State\.step"):
        from_dict(State, {**good, "step": "two"})
    with pytest.raises(SerializationError, match="token_ids"):
        from_dict(Completion, {"text": "x", "token_ids": ["a"]})
    with pytest.raises(TypeError, match="cannot decode"):
        from_dict(int, {})


# -- JSONL -----------------------------------------------------------------------------------


def _traj(i: int) -> Trajectory:
    s0 = State(observation=Observation(text=f"start {i}"), task=i)
    s1 = State(
        observation=Observation(text="end"),
        task=i,
        step=1,
        actions=(Action(text="go"),),
        terminated=True,
    )
    return Trajectory(
        episode_id=f"ep{i}",
        initial_state=s0,
        transitions=(Transition(state=s0, action=Action(text="go"), next_state=s1, reward=1.0),),
        stop_reason="terminated",
    )


def test_writer_flushes_each_line_before_close(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    writer = JsonlWriter(path)
    writer.write_trajectory(_traj(0), key={"task": 0, "rollout": 0})
    # Visible to another reader without closing the writer.
    assert [r["key"] for r in read_jsonl(path)] == [{"task": 0, "rollout": 0}]
    writer.write_trajectory(_traj(1), key={"task": 1, "rollout": 0})
    assert read_trajectories(path) == [_traj(0), _traj(1)]
    writer.close()


def test_truncated_last_line_is_skipped_then_repaired_on_append(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with JsonlWriter(path) as writer:
        writer.write_trajectory(_traj(0))
        writer.write_trajectory(_traj(1))
    full = path.read_bytes()
    path.write_bytes(full[: len(full) - 25])  # the second line, cut mid-write
    assert read_trajectories(path) == [_traj(0)]
    with JsonlWriter(path) as writer:
        writer.write_trajectory(_traj(2))
    assert read_trajectories(path) == [_traj(0), _traj(2)]
    assert path.read_text().count("\n") == 2


def test_repair_finds_the_start_of_a_long_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    big = Trajectory(
        episode_id="big", initial_state=State(observation=Observation(text="x" * 300_000))
    )
    with JsonlWriter(path) as writer:
        writer.write_trajectory(_traj(0))
        writer.write_trajectory(big)
    path.write_bytes(path.read_bytes()[:-100_000])  # cut far from any newline
    with JsonlWriter(path) as writer:
        writer.write_trajectory(_traj(1))
    assert read_trajectories(path) == [_traj(0), _traj(1)]


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps({"trajectory": to_dict(_traj(0))}))
    assert read_trajectories(path) == [_traj(0)]
    with JsonlWriter(path) as writer:
        writer.write_trajectory(_traj(1))
    assert read_trajectories(path) == [_traj(0), _traj(1)]


def test_malformed_middle_line_is_an_error_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    line = json.dumps({"trajectory": to_dict(_traj(0))})
    path.write_text(f"{line}\n{{oops\n{line}\n")
    with pytest.raises(SerializationError, match=r"out\.jsonl:2: malformed"):
        read_jsonl(path)
    path.write_text(f"{line}\n[1, 2]\n")
    with pytest.raises(SerializationError, match=r":2: expected a JSON object"):
        read_jsonl(path)
    path.write_text('{"key": 1}\n')
    with pytest.raises(SerializationError, match="no 'trajectory'"):
        read_trajectories(path)


def test_last_line_cut_inside_a_multibyte_character_is_truncation(tmp_path: Path) -> None:
    # ensure_ascii=False: a writer killed mid-line can cut a UTF-8 character in two.
    path = tmp_path / "out.jsonl"
    unicode_traj = Trajectory(
        episode_id="u", initial_state=State(observation=Observation(text="ok ✓✓✓"))
    )
    with JsonlWriter(path) as writer:
        writer.write_trajectory(_traj(0))
        writer.write_trajectory(unicode_traj)
    full = path.read_bytes()
    cut = full.rindex("✓".encode()) + 1  # inside the last check mark
    path.write_bytes(full[:cut])
    assert read_trajectories(path) == [_traj(0)]
    with JsonlWriter(path) as writer:
        writer.write_trajectory(_traj(1))
    assert read_trajectories(path) == [_traj(0), _traj(1)]


def test_invalid_utf8_in_a_middle_line_is_an_error_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    line = json.dumps({"trajectory": to_dict(_traj(0))}).encode()
    path.write_bytes(line + b"\n" + b'{"x": "\xe2\x9c"}\n' + line + b"\n")
    with pytest.raises(SerializationError, match=r"out\.jsonl:2: malformed"):
        read_jsonl(path)


@pytest.mark.parametrize("reward", [True, False, 2, math.inf, -math.inf])
def test_every_reward_the_writer_accepts_reads_back(tmp_path: Path, reward: Any) -> None:
    # A user environment may return a bool (``reward=passed``) or an int.
    s0 = State(observation=Observation(text="a"))
    s1 = State(observation=Observation(text="b"), step=1, actions=(Action(text="go"),))
    traj = Trajectory(
        episode_id="r",
        initial_state=s0,
        transitions=(Transition(state=s0, action=Action(text="go"), next_state=s1, reward=reward),),
    )
    path = tmp_path / "out.jsonl"
    with JsonlWriter(path) as writer:
        writer.write_trajectory(traj)
    (back,) = read_trajectories(path)
    assert back == traj
    assert type(back.transitions[0].reward) is float


def test_nan_reward_and_logprobs_survive_a_file(tmp_path: Path) -> None:
    s0 = State(observation=Observation(text="a"))
    s1 = State(observation=Observation(text="b"), step=1, actions=(Action(text="go"),))
    completion = Completion(text="go", token_ids=(1, 2), logprobs=(math.nan, -math.inf))
    traj = Trajectory(
        episode_id="n",
        initial_state=s0,
        transitions=(
            Transition(
                state=s0, action=Action(text="go"), next_state=s1, reward=math.nan,
                completion=completion,
            ),
        ),
    )  # fmt: skip
    path = tmp_path / "out.jsonl"
    with JsonlWriter(path) as writer:
        writer.write_trajectory(traj)
    (back,) = read_trajectories(path)
    assert math.isnan(back.transitions[0].reward)
    logprobs = back.transitions[0].completion.logprobs  # type: ignore[union-attr]
    assert logprobs is not None and math.isnan(logprobs[0]) and logprobs[1] == -math.inf


def test_a_non_numeric_reward_is_a_clear_error() -> None:
    s0 = State(observation=Observation(text="a"))
    bad = Transition(state=s0, action=Action(text="go"), next_state=s0, reward="high")  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match=r"Transition\.reward"):
        to_dict(bad)
