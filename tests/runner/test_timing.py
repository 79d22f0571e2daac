"""Timing on trajectories (started_at, wall, restore, per-step generate/step), the same
under every schedule and the stream. A fake clock moved only by the environment and the
backend makes every duration exact."""

from __future__ import annotations

import copy
import pickle
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from llenvs_async import (
    Action,
    Completion,
    GenerationRequest,
    SamplingParams,
    ScriptedBackend,
    State,
    StepResult,
    TrajectoryRunner,
    _timing,
)
from llenvs_async.envs import ArithmeticEnv, CounterEnv
from llenvs_async.serialization import JsonlWriter, read_trajectories

from .conftest import counter_policy

SCHEDULES = ("chunks", "refill", "async")
GENERATE, STEP, RESET = 2.0, 0.5, 0.25  # fake seconds (exact in binary floating point)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(_timing, "clock", fake)
    return fake


class TimedCounter(CounterEnv):
    """A counter whose reset and step take RESET and STEP fake seconds."""

    def __init__(self, clock: Clock, info: dict[str, object] | None = None) -> None:
        super().__init__()
        self.clock, self.info = clock, info

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        state = await super()._reset(task, seed=seed)
        self.clock.now += RESET
        return state

    async def _step(self, state: State, action: Action) -> StepResult:
        result = await super()._step(state, action)
        self.clock.now += STEP
        if self.info is None:
            return result
        return StepResult.of(result.next_state, result.reward, info=self.info)


class TimedBackend(ScriptedBackend):
    """Each generate call takes GENERATE fake seconds."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(counter_policy)
        self.clock = clock

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        out = await super().generate(requests, params)
        self.clock.now += GENERATE
        return out


def _runner(clock: Clock, info: dict[str, object] | None = None) -> TrajectoryRunner:
    async def factory() -> TimedCounter:
        return TimedCounter(clock, info)

    return TrajectoryRunner(TimedCounter(clock), TimedBackend(clock), env_factory=factory)


@pytest.mark.parametrize("schedule", SCHEDULES)
async def test_one_rollout_records_exact_durations(clock: Clock, schedule: str) -> None:
    [traj] = await _runner(clock).run_batch([2], schedule=schedule)  # type: ignore[arg-type]
    assert [t.action.text for t in traj.transitions] == ["inc", "inc", "submit"]
    assert [dict(t.info) for t in traj.transitions] == [
        {"generate_sec": GENERATE, "step_sec": STEP}
    ] * 3
    assert traj.info["restore_sec"] == RESET
    assert traj.info["wall_sec"] == RESET + 3 * (GENERATE + STEP)


@pytest.mark.parametrize("schedule", SCHEDULES)
async def test_a_batch_splits_each_rollouts_wall_into_its_parts(
    clock: Clock, schedule: str
) -> None:
    """Restore, generate (waits for batch-mates included) and step are disjoint spans of a
    rollout's wall time; a rollout that steps first waits for the others' steps."""
    targets = [1, 3, 2, 0, 4]
    trajs = await _runner(clock).run_batch(targets, batch_size=3, schedule=schedule)  # type: ignore[arg-type]
    waited = False
    for traj, target in zip(trajs, targets, strict=True):
        assert len(traj) == target + 1 and traj.success
        parts = [traj.info["restore_sec"]]
        for t in traj.transitions:
            assert t.info["generate_sec"] >= GENERATE and t.info["step_sec"] >= STEP
            waited |= t.info["generate_sec"] > GENERATE
            parts += [t.info["generate_sec"], t.info["step_sec"]]
        assert traj.info["wall_sec"] >= sum(parts) - 1e-6 * len(parts)
    assert waited  # batching waits are part of generate_sec


async def test_restore_is_timed_and_a_pure_start_is_not(clock: Clock) -> None:
    runner = _runner(clock)
    [start] = await runner.run_batch([3], max_steps=2)
    saved = start.final_state
    [restored] = await runner.run_batch_from_states([saved])
    assert restored.info["restore_sec"] == RESET + 2 * STEP  # replay: reset + 2 steps
    env = ArithmeticEnv()
    pure = TrajectoryRunner(env, ScriptedBackend(lambda r: "4"))
    [traj] = await pure.run_batch_from_states([await env.reset(0)])
    assert "restore_sec" not in traj.info and "wall_sec" in traj.info


async def test_a_forced_first_action_has_no_generate_time(clock: Clock) -> None:
    runner = _runner(clock)
    start = await TimedCounter(clock).reset(2)
    [traj] = await runner.run_batch_from_state_actions([start], [Action(text="inc")])
    assert dict(traj.transitions[0].info) == {"step_sec": STEP}
    assert traj.transitions[1].info["generate_sec"] == GENERATE


async def test_the_environments_own_info_keys_are_kept(clock: Clock) -> None:
    info = {"step_sec": "the env's", "x": 1}
    [traj] = await _runner(clock, info).run_batch([0])
    assert dict(traj.transitions[0].info) == {
        "generate_sec": GENERATE,
        "step_sec": "the env's",
        "x": 1,
    }


async def test_the_stream_records_the_same_timing(clock: Clock) -> None:
    async with _runner(clock).stream([2], group_size=1, batch_size=1) as stream:
        [group] = [g async for g in stream]
    [traj] = group
    assert [dict(t.info) for t in traj.transitions] == [
        {"generate_sec": GENERATE, "step_sec": STEP}
    ] * 3
    assert traj.info["wall_sec"] == RESET + 3 * (GENERATE + STEP)


async def test_started_at_is_utc_milliseconds_and_timing_survives_jsonl(tmp_path: Path) -> None:
    before = datetime.now(UTC)
    [traj] = await TrajectoryRunner(CounterEnv(), ScriptedBackend(counter_policy)).run_batch([1])
    after = datetime.now(UTC)
    started = traj.info["started_at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", started)
    assert (
        before.replace(microsecond=before.microsecond // 1000 * 1000)
        <= (datetime.fromisoformat(started))
        <= after
    )
    assert all(isinstance(traj.info[k], float) for k in ("wall_sec", "restore_sec"))
    path = tmp_path / "t.jsonl"
    with JsonlWriter(path) as out:
        out.write_trajectory(traj)
    [back] = read_trajectories(path)
    assert dict(back.info) == dict(traj.info)
    assert [dict(t.info) for t in back.transitions] == [dict(t.info) for t in traj.transitions]
    assert set(back.transitions[0].info) == {"generate_sec", "step_sec"}


async def test_step_info_reads_as_a_dict_and_copies_as_one(clock: Clock) -> None:
    [traj] = await _runner(clock, {"x": 1}).run_batch([0])
    info = traj.transitions[0].info
    expected = {"generate_sec": GENERATE, "step_sec": STEP, "x": 1}
    assert info == expected and len(info) == 3 and list(info) == list(expected)
    assert info.get("missing") is None and "step_sec" in info
    for back in (pickle.loads(pickle.dumps(info)), copy.deepcopy(info)):
        assert type(back) is dict and back == expected
    with pytest.raises(TypeError):
        info["x"] = 2  # type: ignore[index]
