"""ray_env_factory on a real two-node Ray cluster (127.0.0.1): placement, errors, limits."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from llenvs_async import ScriptedBackend, TrajectoryRunner
from llenvs_async.env import Environment, replay_restore
from llenvs_async.envs import CounterEnv
from llenvs_async.errors import EnvError, StaleStateError
from llenvs_async.types import Action, GenerationRequest

from . import _envs
from .conftest import DOCKER_PER_NODE, live_actors, node_ids


def test_import_llenvs_async_does_not_import_ray() -> None:
    code = (
        "import sys, llenvs_async, llenvs_async.distributed, llenvs_async.cli; "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


async def test_rollouts_run_in_actors_spread_over_both_nodes(ray_cluster: object) -> None:
    from llenvs_async.distributed import RayEnvironment, ray_env_factory, remote_restore

    factory = ray_env_factory(_envs.counter)
    runner = TrajectoryRunner(
        CounterEnv(), ScriptedBackend(_envs.counter_policy),
        env_factory=factory, restore_fn=remote_restore(replay_restore),
    )  # fmt: skip
    tasks = [1, 2, 3, 4, 5, 1, 2, 3]
    trajectories = await runner.run_batch(tasks, batch_size=6)
    assert [t.error for t in trajectories] == [None] * len(tasks)
    assert [t.total_reward for t in trajectories] == [1.0] * len(tasks)
    assert [len(t) for t in trajectories] == [task + 1 for task in tasks]
    nodes = set(node_ids(ray_cluster).values())
    assert {t.info["node_id"] for t in trajectories} == nodes and len(nodes) >= 2
    assert factory.created == len(tasks) and factory.peak_live == 6
    assert runner.stats.peak_live_instances == 6
    assert factory.live == 0 and live_actors() == []

    # Restoring through the actor: the replay runs there, the continuation here.
    saved = trajectories[4].transitions[2].next_state  # task 5, counter at 3
    again = await runner.run_batch_from_states([saved] * 4, batch_size=4)
    assert [(t.total_reward, len(t), t.error) for t in again] == [(1.0, 3, None)] * 4
    assert live_actors() == []

    proxy = await factory()
    async with proxy:
        assert isinstance(proxy, RayEnvironment) and isinstance(proxy, Environment)
        assert (proxy.pure_step, proxy.max_steps) == (False, 20)
        assert proxy.node_id in nodes and proxy.info["node_id"] == proxy.node_id
        state = await proxy.reset(2)
        step = await proxy.step(state, Action(text="inc"))
        assert step.next_state.observation.text == "Counter is 1."
        assert live_actors() == [proxy.placement.actor_name]
    assert proxy.closed and live_actors() == []


async def test_remote_errors_keep_their_class_and_the_node(ray_cluster: object) -> None:
    from llenvs_async.adapters.harbor import SnapshotRestore
    from llenvs_async.distributed import RemoteEnvError, ray_env_factory, remote_restore

    proxy = await ray_env_factory(_envs.counter)()
    async with proxy:
        state = await proxy.reset(3)
        await proxy.step(state, Action(text="inc"))
        with pytest.raises(StaleStateError) as stale:  # stepping an old state again
            await proxy.step(state, Action(text="inc"))
        assert stale.value.expected == (state.episode_id, 1)
        assert any(proxy.node_id in note for note in stale.value.__notes__)
        with pytest.raises(EnvError, match="unknown task"):
            await proxy.reset("nope")
    # A class that cannot be rebuilt in the driver (VerifierError needs its `kind`)
    # arrives as RemoteEnvError naming it; through the runner: a recorded factory error.
    runner = TrajectoryRunner(
        CounterEnv(), ScriptedBackend(_envs.counter_policy),
        env_factory=ray_env_factory(_envs.failing_factory),
    )  # fmt: skip
    (failed,) = await runner.run_batch([1])
    assert failed.error is not None and failed.error.phase == "factory"
    assert failed.error.type == "RemoteEnvError"
    assert "VerifierError: the factory failed on purpose" in failed.error.message
    assert live_actors() == []
    with pytest.raises(TypeError, match="cannot ship SnapshotRestore"):
        remote_restore(SnapshotRestore())
    with pytest.raises(RemoteEnvError) as info:
        await ray_env_factory(_envs.failing_factory)()
    assert info.value.remote_type == "llenvs_async.errors.VerifierError"


async def test_no_free_node_makes_creation_wait_then_a_recorded_factory_error(
    ray_cluster: object,
) -> None:
    from llenvs_async.distributed import ray_env_factory

    # Each instance takes a whole node's `docker`: with two nodes, a third must wait.
    factory = ray_env_factory(
        _envs.counter, resources={"docker": DOCKER_PER_NODE}, placement_timeout=3.0
    )
    runner = TrajectoryRunner(
        CounterEnv(), ScriptedBackend(_envs.counter_policy), env_factory=factory
    )
    alive = len(node_ids(ray_cluster))
    trajectories = await runner.run_batch([1] * (alive + 1))
    failed = [t for t in trajectories if t.error is not None]
    assert len(failed) == 1 and failed[0].error is not None
    assert (failed[0].error.phase, failed[0].error.type) == ("factory", "PlacementTimeoutError")
    assert "placement_timeout=3.0s" in failed[0].error.message
    assert [t.total_reward for t in trajectories if t.error is None] == [1.0] * alive
    assert factory.peak_live == alive and live_actors() == []
    # Once the instances are gone the resources are free again: the same batch, sequential.
    again = await runner.run_batch([1] * (alive + 1), batch_size=alive)
    assert [t.error for t in again] == [None] * (alive + 1)


async def test_cancelling_a_run_kills_every_actor_it_made(ray_cluster: object) -> None:
    from llenvs_async.distributed import ray_env_factory

    factory = ray_env_factory(_envs.slow_counter)
    stepped = asyncio.Event()

    def policy(request: object) -> str:
        if getattr(request, "step", 0) >= 2:
            stepped.set()
        return "inc"

    runner = TrajectoryRunner(CounterEnv(), ScriptedBackend(policy), env_factory=factory)
    run = asyncio.create_task(runner.run_batch([10] * 6))
    await stepped.wait()
    assert factory.live == 6 and len(live_actors()) == 6
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert factory.live == 0 and live_actors() == []


async def test_a_killed_actor_fails_only_its_rollout(ray_cluster: object) -> None:
    import ray

    from llenvs_async.distributed import ray_env_factory

    factory = ray_env_factory(_envs.counter)
    victim: list[str] = []

    def policy(request: GenerationRequest) -> str:
        if request.step == 1 and not victim:  # every instance exists and has stepped once
            proxy = next(iter(factory._live.values()))
            victim.append(proxy.node_id)
            ray.kill(proxy._actor, no_restart=True)
        return _envs.counter_policy(request)

    runner = TrajectoryRunner(CounterEnv(), ScriptedBackend(policy), env_factory=factory)
    trajectories = await runner.run_batch([3] * 4)
    failed = [t for t in trajectories if t.error is not None]
    assert len(failed) == 1 and failed[0].error is not None
    assert (failed[0].error.phase, failed[0].error.type) == ("step", "InstanceLostError")
    assert failed[0].info["node_id"] == victim[0] and victim[0] in failed[0].error.message
    assert [t.total_reward for t in trajectories if t.error is None] == [1.0] * 3
    assert factory.live == 0 and live_actors() == []


async def test_a_step_shares_the_driver_s_history_as_a_local_step_does(ray_cluster: object) -> None:
    from llenvs_async.distributed import ray_env_factory

    proxy = await ray_env_factory(_envs.counter)()
    async with proxy:
        state = await proxy.reset(3)
        for _ in range(3):
            action = Action(text="inc")
            result = await proxy.step(state, action)
            # Only the new step crossed: the next state extends this very history.
            assert result.next_state.history.extends(state.history)
            assert result.next_state.history.last is not None
            assert result.next_state.history.last.action is action
            state = result.next_state
        assert state.observation.text == "Counter is 3." and len(state.history) == 3


async def test_instances_sharing_actors_run_the_same_rollouts(ray_cluster: object) -> None:
    from llenvs_async.distributed import ray_env_factory, remote_restore

    with pytest.raises(ValueError, match="instances_per_actor"):
        ray_env_factory(_envs.counter, instances_per_actor=0)
    # Each actor reserves docker 3 (of 4 per node): two actors take both nodes.
    factory = ray_env_factory(_envs.counter, instances_per_actor=3)
    actors: list[int] = []

    def policy(request: GenerationRequest) -> str:
        actors.append(factory.actors)
        return _envs.counter_policy(request)

    runner = TrajectoryRunner(
        CounterEnv(), ScriptedBackend(policy),
        env_factory=factory, restore_fn=remote_restore(replay_restore),
    )  # fmt: skip
    tasks = [1, 2, 3, 4, 5, 1, 2, 3]
    trajectories = await runner.run_batch(tasks, batch_size=6)
    local = await TrajectoryRunner(CounterEnv(), ScriptedBackend(_envs.counter_policy)).run_batch(
        tasks, batch_size=6
    )
    assert [t.error for t in trajectories] == [None] * len(tasks)
    assert [[s.action for s in t.transitions] for t in trajectories] == [
        [s.action for s in t.transitions] for t in local
    ]
    assert [t.total_reward for t in trajectories] == [1.0] * len(tasks)
    assert {t.info["node_id"] for t in trajectories} == set(node_ids(ray_cluster).values())
    assert max(actors) == 2 and factory.peak_live == 6 and factory.created == len(tasks)
    assert factory.live == 0 and factory.actors == 0 and live_actors() == []

    saved = trajectories[4].transitions[2].next_state  # task 5, counter at 3
    again = await runner.run_batch_from_states([saved] * 4, batch_size=4)
    assert [(t.total_reward, len(t), t.error) for t in again] == [(1.0, 3, None)] * 4
    assert factory.actors == 0 and live_actors() == []


async def test_a_killed_shared_actor_fails_exactly_its_instances(ray_cluster: object) -> None:
    import ray

    from llenvs_async.distributed import ray_env_factory

    factory = ray_env_factory(_envs.counter, instances_per_actor=2)
    victim: list[str] = []

    def policy(request: GenerationRequest) -> str:
        if request.step == 1 and not victim:  # every instance exists and has stepped once
            proxy = next(iter(factory._live.values()))
            victim.append(proxy.placement.actor_name)
            ray.kill(proxy._actor, no_restart=True)
        return _envs.counter_policy(request)

    runner = TrajectoryRunner(CounterEnv(), ScriptedBackend(policy), env_factory=factory)
    trajectories = await runner.run_batch([3] * 4)
    failed = [t for t in trajectories if t.error is not None]
    assert len(failed) == 2
    assert {(t.error.phase, t.error.type) for t in failed if t.error} == {
        ("step", "InstanceLostError")
    }
    assert [t.total_reward for t in trajectories if t.error is None] == [1.0] * 2
    assert factory.live == 0 and factory.actors == 0 and live_actors() == []


async def test_cancelling_one_batched_step_cancels_it_in_the_actor_only(
    ray_cluster: object,
) -> None:
    from llenvs_async.distributed import ray_env_factory

    factory = ray_env_factory(_envs.slower_counter, instances_per_actor=2)
    first, second = await asyncio.gather(factory(), factory())
    async with first, second:
        assert first.placement.actor_name == second.placement.actor_name
        assert first.placement.slot != second.placement.slot
        states = await asyncio.gather(first.reset(5), second.reset(5))
        steps = [
            asyncio.ensure_future(p.step(s, Action(text="inc")))
            for p, s in zip((first, second), states, strict=True)
        ]
        await asyncio.sleep(0.3)  # both in flight in the actor, as one batch
        steps[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await steps[0]
        assert (await steps[1]).next_state.observation.text == "Counter is 1."
        # The cancelled step never finished there: its instance still steps from `states[0]`.
        again = await first.step(states[0], Action(text="inc"))
        assert again.next_state.observation.text == "Counter is 1."
    assert factory.live == 0 and factory.actors == 0 and live_actors() == []


async def test_cancelling_a_run_of_shared_actors_kills_them_all(ray_cluster: object) -> None:
    from llenvs_async.distributed import ray_env_factory

    factory = ray_env_factory(_envs.slow_counter, instances_per_actor=3)
    stepped = asyncio.Event()

    def policy(request: object) -> str:
        if getattr(request, "step", 0) >= 2:
            stepped.set()
        return "inc"

    runner = TrajectoryRunner(CounterEnv(), ScriptedBackend(policy), env_factory=factory)
    run = asyncio.create_task(runner.run_batch([10] * 6))
    await stepped.wait()
    assert factory.live == 6 and factory.actors == 2 and len(live_actors()) == 2
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert factory.live == 0 and factory.actors == 0 and live_actors() == []


async def test_a_stop_the_runner_makes_is_verified_in_the_actor(ray_cluster: object) -> None:
    from llenvs_async.distributed import ray_env_factory

    factory = ray_env_factory(_envs.verified_counter)
    runner = TrajectoryRunner(
        CounterEnv(), ScriptedBackend(lambda request: "inc"), env_factory=factory, max_steps=3
    )
    [cut] = await runner.run_batch([9])
    assert cut.error is None and cut.stop_reason == "max_steps" and len(cut) == 3
    last = cut.transitions[-1]
    assert last.info["verified_because"] == "max_steps" and last.reward == 1.0
    assert factory.live == 0 and live_actors() == []


async def test_the_proxy_offers_what_its_instance_declares(ray_cluster: object) -> None:
    """Tools, prompts, stop sequences and reward range cross to the driver as one value, and a
    runner built on the proxy sends them as it would for a local instance."""
    from llenvs_async.distributed import ray_env_factory
    from llenvs_async.env import AgentEnvironment, AgentSurface
    from llenvs_async.testing import RecordingBackend

    local = _envs.OfferingCounter()
    factory = ray_env_factory(_envs.offering_counter)
    proxy = await factory()
    async with proxy:
        assert isinstance(proxy, AgentEnvironment)
        assert AgentSurface.of(proxy) == AgentSurface.of(local) != AgentSurface()
        backend = RecordingBackend(ScriptedBackend(lambda request: "submit"))
        [done] = await TrajectoryRunner(proxy, backend).run_batch([1])
    assert done.error is None and proxy.closed and live_actors() == []
    [request] = backend.calls[0]
    assert request.tools == local.tools and backend.params[0].stop == ("\nEND",)
    assert [m.content for m in request.messages[:3]] == ["Count up.", "to 1", "inc"]
