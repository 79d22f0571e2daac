"""TrajectoryRunner's multi-instance path with 16 DockerEnvironment rollouts: no leaks, ever."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable

import pytest

from llenvs_async import Action, GenerationRequest, State, StepResult, TrajectoryRunner
from llenvs_async._ownership import OWNER_LABEL
from llenvs_async.backends.scripted import ScriptedBackend
from llenvs_async.docker import DockerEngine, DockerEnvironment, reap_orphans
from llenvs_async.env import replay_restore
from llenvs_async.policies import fenced, shell_reply
from llenvs_async.types import SamplingParams

N = 16
VERIFY = 'test "$(cat /tmp/out)" -gt 0'


def solver(request: GenerationRequest) -> str:
    """Write the task's double, look at it, submit."""
    return shell_reply(
        {0: f"echo $(( {request.task} * 2 + 1 )) > /tmp/out", 1: "cat /tmp/out"}.get(
            request.step, "SUBMIT"
        )
    )


@pytest.fixture
async def template(engine: DockerEngine, busybox_image: str) -> AsyncIterator[DockerEnvironment]:
    env = DockerEnvironment(image=busybox_image, engine=engine, verify_command=VERIFY)
    try:
        yield env
    finally:
        await env.aclose()


def _runner(
    engine: DockerEngine,
    template: DockerEnvironment,
    policy: Callable[[GenerationRequest], str],
    env_class: type[DockerEnvironment] = DockerEnvironment,
    **env_kwargs: object,
) -> TrajectoryRunner:
    kwargs = {
        "image": template.spec.image,
        "engine": engine,
        "verify_command": VERIFY,
        **env_kwargs,
    }
    return TrajectoryRunner(
        environment=template,
        backend=ScriptedBackend(policy),
        sampling_params=SamplingParams(),
        env_factory=env_class.factory(**kwargs),
        restore_fn=replay_restore,
    )


async def test_sixteen_rollouts_succeed_and_leave_nothing(
    engine: DockerEngine, template: DockerEnvironment
) -> None:
    runner = _runner(engine, template, solver)
    trajectories = await runner.run_batch(list(range(N)))
    assert [t.index for t in trajectories] == list(range(N))
    assert all(t.success and t.error is None for t in trajectories)
    assert [t.transitions[1].next_state.observation.text for t in trajectories] == [
        str(2 * i + 1) for i in range(N)
    ]
    assert await engine.own_containers() == []

    mid: State = trajectories[5].transitions[0].next_state  # /tmp/out written, not yet read
    restored = await runner.run_batch_from_states([mid] * 4, batch_size=4)
    assert all(t.success for t in restored)
    assert [t.transitions[0].next_state.observation.text for t in restored] == ["11"] * 4
    assert await engine.own_containers() == []


class _FailsOnTaskThree(DockerEnvironment):
    async def _step(self, state: State, action: Action) -> StepResult:
        if state.task == 3 and state.step == 1:
            raise RuntimeError("boom in rollout 3")
        return await super()._step(state, action)


async def test_a_raising_rollout_is_data_and_leaves_nothing(
    engine: DockerEngine, template: DockerEnvironment
) -> None:
    runner = _runner(engine, template, solver, env_class=_FailsOnTaskThree)
    trajectories = await runner.run_batch(list(range(N)))
    failed = [t.index for t in trajectories if t.error is not None]
    assert failed == [3] and trajectories[3].error is not None
    assert "boom in rollout 3" in trajectories[3].error.message
    assert sum(t.success for t in trajectories) == N - 1
    assert await engine.own_containers() == []


async def test_cancelling_the_awaiting_task_leaves_nothing(
    engine: DockerEngine, template: DockerEnvironment
) -> None:
    stepping = asyncio.Event()

    def hang(request: GenerationRequest) -> str:
        stepping.set()
        return fenced("sleep 1000")

    runner = _runner(engine, template, hang, command_timeout=None)
    task = asyncio.create_task(runner.run_batch(list(range(N))))
    async with asyncio.timeout(60):
        await stepping.wait()
    assert len(await engine.own_containers()) == N
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await engine.own_containers() == []


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from llenvs_async import TrajectoryRunner
    from llenvs_async.backends.scripted import ScriptedBackend
    from llenvs_async.docker import DockerEngine, DockerEnvironment
    from llenvs_async.policies import fenced

    async def main():
        async with DockerEngine() as engine:
            def policy(request):
                if request.step == 0:
                    print("RUNNING", flush=True)
                return fenced("sleep 1000")
            factory = DockerEnvironment.factory(image={image!r}, engine=engine,
                                                command_timeout=None)
            runner = TrajectoryRunner(environment=await factory(),
                                      backend=ScriptedBackend(policy), env_factory=factory)
            await runner.run_batch(list(range({n})))

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        sys.exit(0)
    """
)


def _start_child(image: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(image=image, n=N)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the batch is stepping (or the child died)
    assert line.strip() == "RUNNING", proc.communicate(timeout=30)
    return proc


async def _child_containers(engine: DockerEngine, proc: subprocess.Popen[str]) -> int:
    owner = f"{os.uname().nodename}:{proc.pid}"
    return len(await engine.list_containers({OWNER_LABEL: owner}))


async def test_sigint_to_a_child_running_a_batch_leaves_nothing(
    engine: DockerEngine, busybox_image: str
) -> None:
    proc = _start_child(busybox_image)
    try:
        assert await _child_containers(engine, proc) == N
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.to_thread(proc.communicate, timeout=120)
        assert "INTERRUPTED" in out, err
        assert await _child_containers(engine, proc) == 0
    finally:
        proc.kill()
        proc.wait()


async def test_sigkill_of_a_child_then_reap_orphans_leaves_nothing(
    engine: DockerEngine, busybox_image: str
) -> None:
    proc = _start_child(busybox_image)
    try:
        assert await _child_containers(engine, proc) == N
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert await _child_containers(engine, proc) == N  # SIGKILL: nothing could clean up
    reaped = await reap_orphans(engine)
    assert sum(r.owner.endswith(f":{proc.pid}") for r in reaped) == N
    assert await _child_containers(engine, proc) == 0
