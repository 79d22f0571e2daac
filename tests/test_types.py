from __future__ import annotations

import dataclasses

import pytest

from llenvs_async import (
    Action,
    Completion,
    Observation,
    SamplingParams,
    State,
    StepResult,
    Trajectory,
    Transition,
)
from llenvs_async.types import ErrorInfo


def _state(step: int = 0, **kw: object) -> State:
    return State(observation=Observation(text=f"s{step}"), step=step, **kw)  # type: ignore[arg-type]


def test_values_are_frozen_and_slotted() -> None:
    s = _state()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.step = 3  # type: ignore[misc]
    assert not hasattr(s, "__dict__")


def test_defaults_match_design() -> None:
    s = _state()
    assert (s.task, s.step, s.episode_id, s.actions) == (None, 0, "", ())
    assert not s.terminated and not s.truncated and not s.done
    assert _state(truncated=True).done
    c = Completion(text="x")
    assert c.token_ids == () and c.logprobs is None and c.finish_reason is None


def test_keyword_only() -> None:
    with pytest.raises(TypeError):
        Action("ls")  # type: ignore[misc]


def test_trajectory_properties() -> None:
    s0, s1 = _state(0), _state(1, terminated=True)
    a = Action(text="go")
    t = Trajectory(
        episode_id="e",
        initial_state=s0,
        transitions=(Transition(state=s0, action=a, next_state=s1, reward=1.0),),
    )
    assert t.total_reward == 1.0 and t.final_state is s1 and t.done and t.success
    assert t.actions == (a,) and t.states == (s0, s1) and len(t) == 1
    failed = dataclasses.replace(t, error=ErrorInfo(type="X", message="boom"))
    assert not failed.success


def test_discounted_return() -> None:
    s = _state()
    trans = tuple(
        Transition(state=s, action=Action(text="a"), next_state=s, reward=r)
        for r in (0.0, 0.0, 1.0)
    )
    t = Trajectory(episode_id="e", initial_state=s, transitions=trans)
    assert t.discounted_return(0.5) == pytest.approx(0.25)
    assert t.discounted_return() == 1.0


def test_error_info_keeps_traceback() -> None:
    try:
        raise RuntimeError("nope")
    except RuntimeError as exc:
        info = ErrorInfo.from_exception(exc, phase="step")
    assert info.type == "RuntimeError" and info.message == "nope" and "nope" in info.traceback


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 0), ("temperature", -1.0), ("top_p", 0.0), ("n", 2)],
)
def test_sampling_params_validation_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_sampling_params_stop_becomes_tuple() -> None:
    assert SamplingParams(stop="\n").stop == ("\n",)  # type: ignore[arg-type]


def test_advance_carries_provenance_and_keeps_hidden_unless_given() -> None:
    s = State(
        observation=Observation(text="s0"), task="t", step=2, episode_id="e",
        actions=(Action(text="a"),), hidden={"h": 1}, info={"i": 1}, seed=7,
    )  # fmt: skip
    b = Action(text="b")
    nxt = s.advance(b, Observation(text="s1"), truncated=True)
    assert (nxt.task, nxt.step, nxt.episode_id, nxt.seed) == ("t", 3, "e", 7)
    assert nxt.actions == (Action(text="a"), b) and s.actions == (Action(text="a"),)
    assert nxt.hidden == {"h": 1} and nxt.info == {"i": 1} and nxt.truncated
    other = s.advance(b, Observation(text="s1"), terminated=True, hidden=None, info={})
    assert other.hidden is None and other.info == {} and other.terminated


def test_step_result_of_takes_the_flags_of_its_state() -> None:
    s = _state(terminated=True)
    r = StepResult.of(s, 1.0, {"k": "v"})
    assert r.terminated and not r.truncated and r.reward == 1.0 and r.info == {"k": "v"}


def test_a_long_history_travels_flat() -> None:
    """States go to Ray actors on every step: a 3000-step chain of parent links must not
    recurse once per step when pickled (cloudpickle, as Ray does)."""
    cloudpickle = pytest.importorskip("cloudpickle")
    from llenvs_async import Action, Observation, State

    state = State(observation=Observation(text="start"))
    for i in range(3000):
        state = state.advance(Action(text=f"a{i}"), Observation(text=f"o{i}"))
    back = cloudpickle.loads(cloudpickle.dumps(state))
    assert back.actions == state.actions and back.history == state.history
    assert back.history.initial == Observation(text="start") and len(back.history) == 3000
