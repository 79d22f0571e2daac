"""Lockstep semantics: one generate call per round, input order, forced actions, errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llenvs_async import (
    Action,
    Completion,
    GenerationRequest,
    LlenvsError,
    SamplingParams,
    ScriptedBackend,
    TrajectoryRunner,
)
from llenvs_async.envs import ArithmeticEnv, ChainEnv, CounterEnv
from llenvs_async.testing import RecordingBackend


def walk_right_until(request: GenerationRequest) -> str:
    return "right"


async def test_one_generate_call_per_round_and_the_batch_shrinks() -> None:
    env = ChainEnv(min_length=1, num_tasks=4, max_steps=10)  # lengths 1..4
    backend = RecordingBackend(ScriptedBackend(walk_right_until))
    runner = TrajectoryRunner(environment=env, backend=backend)
    trajs = await runner.run_batch([3, 0, 2, 1])
    assert [len(t) for t in trajs] == [4, 1, 3, 2]
    assert backend.batch_sizes == [4, 3, 2, 1]  # one call per round, finished rollouts leave
    assert runner.stats.rounds == 4 and runner.stats.generate_calls == 4
    assert all(t.success and t.stop_reason == "terminated" for t in trajs)
    assert [t.index for t in trajs] == [0, 1, 2, 3]


async def test_results_keep_input_order_and_completions() -> None:
    def policy(request: GenerationRequest) -> Completion:
        env = ArithmeticEnv()
        _, answer = env.problem(int(request.task))  # type: ignore[arg-type]
        return Completion(
            text=str(answer), token_ids=(1, 2, 3), logprobs=(-0.1, -0.2, -0.3), finish_reason="stop"
        )

    runner = TrajectoryRunner(environment=ArithmeticEnv(), backend=ScriptedBackend(policy))
    tasks = [9, 4, 7, 1, 0]
    trajs = await runner.run_batch(tasks)
    assert [t.initial_state.task for t in trajs] == tasks
    for t in trajs:
        completion = t.transitions[0].completion
        assert completion is not None
        assert completion.token_ids == (1, 2, 3) and completion.logprobs == (-0.1, -0.2, -0.3)
        assert t.success


async def test_conversation_is_built_from_observations_and_actions() -> None:
    backend = RecordingBackend(ScriptedBackend(lambda r: "right"))
    runner = TrajectoryRunner(
        environment=ChainEnv(min_length=2), backend=backend, system_prompt="be brief"
    )
    await runner.run_batch([0])
    last = backend.calls[-1][0]
    roles = [m.role for m in last.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert last.messages[0].content == "be brief"
    assert last.messages[2].content == "right" and "1 of 2" in last.messages[3].content


async def test_prompt_builder_replaces_the_conversation() -> None:
    from llenvs_async import ChatMessage

    seen: list[int] = []

    def builder(initial, transitions):  # type: ignore[no-untyped-def]
        seen.append(len(transitions))
        return [ChatMessage(role="user", content=f"step {len(transitions)}")]

    backend = RecordingBackend(ScriptedBackend(lambda r: "right"))
    runner = TrajectoryRunner(
        environment=ChainEnv(min_length=3), backend=backend, prompt_builder=builder
    )
    await runner.run_batch([0])
    assert seen == [0, 1, 2]
    assert [c[0].messages[0].content for c in backend.calls] == ["step 0", "step 1", "step 2"]


async def test_sampling_params_reach_the_backend() -> None:
    params = SamplingParams(max_tokens=7, temperature=0.0)
    backend = RecordingBackend(ScriptedBackend(lambda r: "right"))
    runner = TrajectoryRunner(
        environment=ChainEnv(min_length=1), backend=backend, sampling_params=params
    )
    await runner.run_batch([0])
    assert backend.params == [params]


async def test_forced_first_actions_are_used_not_generated() -> None:
    env = ChainEnv(min_length=2, max_steps=5)
    start = await env.reset(0)
    backend = RecordingBackend(ScriptedBackend(lambda r: "right"))
    runner = TrajectoryRunner(environment=env, backend=backend)
    trajs = await runner.run_batch_from_state_actions(
        [start, start, start], [Action(text="left"), "right", Action(text="right")]
    )
    assert [t.actions[0].text for t in trajs] == ["left", "right", "right"]
    assert all(t.transitions[0].completion is None for t in trajs)
    # round 1 needed no generation at all; later rounds only for the unfinished
    assert backend.batch_sizes == [3, 1]
    assert [len(t) for t in trajs] == [3, 2, 2]


async def test_mismatched_forced_actions_raise() -> None:
    env = ChainEnv()
    start = await env.reset(0)
    runner = TrajectoryRunner(environment=env, backend=ScriptedBackend(lambda r: "right"))
    with pytest.raises(ValueError, match="actions has 1 items but states has 2"):
        await runner.run_batch_from_state_actions([start, start], ["left"])


async def test_runner_max_steps_truncates_relative_to_the_start() -> None:
    env = ChainEnv(min_length=4, max_steps=50)
    runner = TrajectoryRunner(environment=env, backend=ScriptedBackend(lambda r: "left"))
    trajs = await runner.run_batch([0, 1], max_steps=3)
    assert [len(t) for t in trajs] == [3, 3]
    assert {t.stop_reason for t in trajs} == {"max_steps"}
    assert not trajs[0].done  # the env did not end it: the runner stopped it


async def test_a_failing_rollout_is_recorded_and_its_siblings_finish(
    counter_factory, tracker
) -> None:  # type: ignore[no-untyped-def]
    def policy(request: GenerationRequest) -> str:
        if request.rollout_index == 2 and request.step == 1:
            return "explode"
        return "inc" if request.step < 2 else "submit"

    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(policy),
        env_factory=counter_factory(fail_on="explode"),
    )
    trajs = await runner.run_batch([2, 2, 2, 2])
    assert [t.error is None for t in trajs] == [True, True, False, True]
    failed = trajs[2]
    assert (
        failed.error is not None
        and failed.error.type == "EnvError"
        and failed.error.phase == "step"
    )
    assert "explode" in failed.error.message and failed.stop_reason == "error"
    assert len(failed) == 1  # the step before the failure is kept
    assert all(t.success for i, t in enumerate(trajs) if i != 2)
    assert tracker.live == 0 and runner.stats.failed == 1 and runner.stats.completed == 3


async def test_backend_failure_fails_that_round_s_rollouts_only() -> None:
    class Flaky:
        calls = 0

        async def generate(self, requests, params):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls == 2:
                raise LlenvsError("server went away")
            return [Completion(text="right") for _ in requests]

        async def aclose(self) -> None:
            pass

    env = ChainEnv(min_length=1, num_tasks=3)
    runner = TrajectoryRunner(environment=env, backend=Flaky())
    trajs = await runner.run_batch([0, 1, 2])
    assert trajs[0].success and trajs[0].error is None
    for t in trajs[1:]:
        assert t.error is not None and t.error.phase == "generate" and len(t) == 1


async def test_wrong_number_of_completions_is_a_backend_error() -> None:
    class Short:
        async def generate(self, requests, params):  # type: ignore[no-untyped-def]
            return [Completion(text="right")]

        async def aclose(self) -> None:
            pass

    runner = TrajectoryRunner(environment=ChainEnv(), backend=Short())
    trajs = await runner.run_batch([0, 1])
    assert all(t.error is not None and "1 completions for 2" in t.error.message for t in trajs)


async def test_programming_errors_propagate() -> None:
    def policy(request: GenerationRequest) -> str:
        raise TypeError("bug in my policy")

    runner = TrajectoryRunner(environment=ChainEnv(), backend=ScriptedBackend(policy))
    with pytest.raises(TypeError, match="bug in my policy"):
        await runner.run_batch([0, 1])


async def test_step_timeout_fails_only_the_slow_rollout(counter_factory) -> None:  # type: ignore[no-untyped-def]
    class Slow(CounterEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            if action.text == "hang":
                import asyncio

                await asyncio.Event().wait()
            return await super()._step(state, action)

    async def factory() -> CounterEnv:
        return Slow()

    runner = TrajectoryRunner(
        environment=Slow(),
        backend=ScriptedBackend(lambda r: "hang" if r.rollout_index == 0 else "submit"),
        env_factory=factory,
        step_timeout=0.05,
    )
    trajs = await runner.run_batch([0, 0])
    assert trajs[0].error is not None and trajs[0].error.type == "StepTimeoutError"
    assert trajs[1].success


async def test_terminal_start_state_gives_an_empty_trajectory() -> None:
    env = ArithmeticEnv()
    s = await env.reset(0)
    done = (await env.step(s, Action(text=str(s.hidden)))).next_state
    backend = RecordingBackend(ScriptedBackend(lambda r: "0"))
    runner = TrajectoryRunner(environment=env, backend=backend)
    [traj] = await runner.run_batch_from_states([done])
    assert len(traj) == 0 and traj.stop_reason == "terminated" and backend.calls == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"batch_size": -3}, ValueError, "batch_size"),
        ({"batch_size": "4"}, TypeError, "batch_size"),
        ({"max_steps": 0}, ValueError, "max_steps"),
    ],
)
async def test_bad_arguments_name_themselves(kwargs, error, match) -> None:  # type: ignore[no-untyped-def]
    runner = TrajectoryRunner(environment=ChainEnv(), backend=ScriptedBackend(lambda r: "right"))
    with pytest.raises(error, match=match):
        await runner.run_batch([0], **kwargs)


async def test_bad_inputs_are_clear_errors() -> None:
    runner = TrajectoryRunner(environment=ChainEnv(), backend=ScriptedBackend(lambda r: "right"))
    with pytest.raises(ValueError, match="tasks is empty"):
        await runner.run_batch([])
    with pytest.raises(TypeError, match="tasks must be a sequence"):
        await runner.run_batch("0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"states\[1\] must be a State"):
        await runner.run_batch_from_states([await ChainEnv().reset(0), "x"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="backend"):
        TrajectoryRunner(environment=ChainEnv(), backend=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step_timeout"):
        TrajectoryRunner(environment=ChainEnv(), backend=ScriptedBackend(str), step_timeout=-1)


async def test_unknown_task_is_recorded_on_its_trajectory() -> None:
    runner = TrajectoryRunner(
        environment=ChainEnv(num_tasks=2), backend=ScriptedBackend(lambda r: "right")
    )
    trajs = await runner.run_batch([0, 99])
    assert trajs[0].success
    assert trajs[1].error is not None and trajs[1].error.phase == "reset"
    assert "unknown task 99" in trajs[1].error.message


async def test_async_policy_errors_keep_their_type() -> None:
    async def failing(request: GenerationRequest) -> str:
        raise LlenvsError("server went away")

    runner = TrajectoryRunner(environment=ChainEnv(), backend=ScriptedBackend(failing))
    [traj] = await runner.run_batch([0])
    assert traj.error is not None and traj.error.phase == "generate"
    assert traj.error.type == "LlenvsError" and traj.error.message == "server went away"

    async def buggy(request: GenerationRequest) -> str:
        raise TypeError("bug in my async policy")

    runner = TrajectoryRunner(environment=ChainEnv(), backend=ScriptedBackend(buggy))
    with pytest.raises(TypeError, match="bug in my async policy"):
        await runner.run_batch([0, 1])


async def test_programming_error_inside_an_exception_group_propagates(
    counter_factory, tracker
) -> None:  # type: ignore[no-untyped-def]
    # An environment that fans out with a TaskGroup raises groups; a TypeError inside
    # one is still a bug in the caller's code and must not be recorded as data.
    class FanOut(CounterEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            if action.text == "boom":
                raise ExceptionGroup("fan-out", [OSError("disk"), TypeError("bad arg")])
            if action.text == "flaky":
                raise ExceptionGroup("fan-out", [OSError("disk")])
            return await super()._step(state, action)

    async def factory() -> CounterEnv:
        return FanOut(tracker=tracker)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(lambda r: "flaky"), env_factory=factory
    )
    [traj] = await runner.run_batch([1])
    assert traj.error is not None and traj.error.type == "ExceptionGroup"  # data: no bug in it

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(lambda r: "boom"), env_factory=factory
    )
    with pytest.raises(ExceptionGroup) as info:
        await runner.run_batch([1, 1])
    assert info.value.subgroup(TypeError) is not None  # the bug is not hidden behind OSError
    assert tracker.live == 0


async def test_forced_action_on_a_terminal_state_is_a_recorded_error(counter_factory) -> None:  # type: ignore[no-untyped-def]
    env = ArithmeticEnv()
    s = await env.reset(0)
    done = (await env.step(s, Action(text=str(s.hidden)))).next_state
    backend = RecordingBackend(ScriptedBackend(lambda r: "0"))
    runner = TrajectoryRunner(environment=env, backend=backend)
    trajs = await runner.run_batch_from_state_actions([done, s], ["1", str(s.hidden)])
    # never silently dropped: an empty error-free trajectory would read as Q(s, a) = 0
    assert trajs[0].error is not None and "forced action" in trajs[0].error.message
    assert len(trajs[0]) == 0 and trajs[0].stop_reason == "error"
    assert trajs[1].success and backend.calls == []

    counter = CounterEnv()
    end = (await counter.step(await counter.reset(0), Action(text="submit"))).next_state
    runner = TrajectoryRunner(environment=counter, backend=backend, env_factory=counter_factory())
    [traj] = await runner.run_batch_from_state_actions([end], ["inc"])
    assert traj.error is not None and traj.stop_reason == "error"


async def test_start_state_at_the_env_step_limit_is_not_stepped() -> None:
    class Unflagged(ChainEnv):
        async def _reset(self, task, *, seed):  # type: ignore[no-untyped-def]
            state = await super()._reset(task, seed=seed)
            return replace(state, step=self.max_steps)  # at the limit but not flagged

    backend = RecordingBackend(ScriptedBackend(lambda r: "right"))
    runner = TrajectoryRunner(environment=Unflagged(max_steps=2), backend=backend)
    [traj] = await runner.run_batch([0])
    assert len(traj) == 0 and traj.stop_reason == "truncated" and backend.calls == []


async def test_a_step_leaking_cancelled_error_is_recorded_not_retried() -> None:
    import asyncio

    class Leaky(ChainEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            raise asyncio.CancelledError("leaked from a library")

    backend = RecordingBackend(ScriptedBackend(lambda r: "right"))
    runner = TrajectoryRunner(environment=Leaky(), backend=backend)
    [traj] = await runner.run_batch([0])
    assert traj.error is not None and "without being cancelled" in traj.error.message
    assert backend.batch_sizes == [1]
