"""Harbor tasks through Ray: ``run_batch_from_states`` with ``harbor_restore`` in the actors,
and a node killed mid-run (real Docker engine, real two-node cluster on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from typing import Any

import pytest

from llenvs_async import ScriptedBackend, TrajectoryRunner
from llenvs_async._ownership import Owner, checkable, process_alive
from llenvs_async.adapters.harbor import HarborAdapter, harbor_restore
from llenvs_async.policies import shell_reply
from llenvs_async.types import GenerationRequest, SamplingParams, State

from . import _envs
from .conftest import REPO, containers_of, live_actors, node_ids

pytestmark = pytest.mark.docker

TASK = "build-release"


async def saved_states() -> tuple[list[State], list[str]]:
    """Mid-trajectory states of a local live run of TASK (which also builds its image),
    and the solution commands."""
    adapter = HarborAdapter()
    env = await adapter.get_environment(_envs.EXAMPLES, max_steps=30)
    async with env:
        task = env.dataset.tasks[env.dataset.index_of(TASK)]
        solution = task.solution_commands()
        runner = TrajectoryRunner(env, ScriptedBackend(policy(solution)))
        (live,) = await runner.run_batch([TASK])
    assert live.success, live.error
    return [s for s in live.states if 0 < s.step <= len(solution)], solution


def policy(solution: list[str]) -> Any:
    def act(request: GenerationRequest) -> str:
        return shell_reply(solution[request.step] if request.step < len(solution) else "SUBMIT")

    return act


def actor_record(session: str) -> list[dict[str, Any]]:
    """The GCS's own record of a factory's actors, the dead ones included (its actor table:
    name, state, worker pid, restarts), not a sample of the live ones at some instant."""
    from ray._private import state

    from llenvs_async.distributed.ray import ACTOR_PREFIX

    prefix = f"{ACTOR_PREFIX}-{session}-"
    return [a for a in state.actors().values() if a["Name"].startswith(prefix)]


async def ended_actors(session: str, limit: float = 60.0) -> list[dict[str, Any]]:
    """``actor_record`` once the GCS has recorded every one of them dead: ``ray.kill`` only
    sends the kill, the GCS records it a moment later (bounded wait, at most ``limit``)."""
    async with asyncio.timeout(limit):
        while True:
            record = actor_record(session)
            if all(a["State"] == "DEAD" for a in record):
                return record
            await asyncio.sleep(0.1)


async def test_run_batch_from_states_with_harbor_restore_on_both_nodes(
    ray_cluster: Any, docker_engine: Any
) -> None:
    from llenvs_async.distributed import ray_env_factory, remote_restore

    saved, solution = await saved_states()
    assert len(saved) == len(solution) >= 6
    factory = ray_env_factory(_envs.harbor)
    runner = TrajectoryRunner(
        await _envs.harbor(), ScriptedBackend(policy(solution)),
        SamplingParams(temperature=0.0), env_factory=factory,
        restore_fn=remote_restore(harbor_restore),
    )  # fmt: skip
    pids: set[int] = set()
    real_call = factory.__call__

    async def tracked() -> Any:
        proxy = await real_call()
        pids.add(proxy.placement.pid)
        return proxy

    runner.env_factory = tracked
    trajectories = await runner.run_batch_from_states(saved, batch_size=4)
    assert [t.error for t in trajectories] == [None] * len(saved)
    assert all(t.success for t in trajectories)
    assert [len(t) for t in trajectories] == [len(solution) + 1 - s.step for s in saved]
    assert [t.initial_state.step for t in trajectories] == [s.step for s in saved]
    nodes = set(node_ids(ray_cluster).values())
    assert {t.info["node_id"] for t in trajectories} == nodes and len(nodes) == 2
    assert factory.created == len(saved)
    assert factory.peak_live == runner.stats.peak_live_instances == 4
    # The cluster ran exactly the actors the factory counted (one instance each, so never
    # more than its peak of 4 at once), none restarted, and every one has ended.
    record = await ended_actors(factory.session)
    assert len(record) == factory.created, record
    assert {a["Pid"] for a in record} == pids
    assert {a["Address"]["NodeID"] for a in record} == nodes
    assert all(a["NumRestarts"] == 0 for a in record), record
    assert live_actors() == []
    assert await containers_of(docker_engine, socket.gethostname(), pids) == []


async def test_killing_a_node_mid_run_fails_only_its_rollouts(
    ray_cluster: Any, docker_engine: Any
) -> None:
    from llenvs_async.distributed import ray_env_factory, remote_restore

    saved, solution = await saved_states()
    victim = ray_cluster.add_node()  # the session's two nodes stay for the other tests
    victim_id = node_ids(ray_cluster)[victim]
    factory = ray_env_factory(_envs.harbor)
    starts = [saved[0]] * 6
    act = policy(solution)
    killed: list[set[int]] = []

    def kill_then_act(request: GenerationRequest) -> str:
        # Every instance is up and has stepped once: the victim node dies now.
        if not killed and request.step == saved[0].step + 1:
            placed = {p.placement.pid for p in factory._live.values()
                      if p.node_id == victim_id}  # fmt: skip
            assert placed, "SPREAD put no instance on the third node"
            killed.append(placed)
            ray_cluster.kill_node(victim)
        return act(request)

    runner = TrajectoryRunner(
        await _envs.harbor(), ScriptedBackend(kill_then_act), env_factory=factory,
        restore_fn=remote_restore(harbor_restore), close_timeout=30.0,
    )  # fmt: skip
    pids_by_node: dict[str, set[int]] = {}
    real_call = factory.__call__

    async def tracked() -> Any:
        proxy = await real_call()
        pids_by_node.setdefault(proxy.node_id, set()).add(proxy.placement.pid)
        return proxy

    runner.env_factory = tracked
    trajectories = await runner.run_batch_from_states(starts, batch_size=6)
    assert killed, "the policy never reached the kill"
    on_victim = [t for t in trajectories if t.info["node_id"] == victim_id]
    others = [t for t in trajectories if t.info["node_id"] != victim_id]
    assert on_victim and others
    for t in on_victim:
        assert t.error is not None and t.stop_reason == "error"
        assert (t.error.phase, t.error.type) == ("step", "InstanceLostError")
        assert victim_id in t.error.message
    assert all(t.error is None and t.success for t in others), [t.error for t in others]
    assert live_actors() == [] and factory.live == 0
    host = socket.gethostname()
    survivors = set().union(*(p for n, p in pids_by_node.items() if n != victim_id))
    assert await containers_of(docker_engine, host, survivors) == []
    # The dead node's containers stay behind (its processes died with SIGKILL) until a
    # cleanup on that node: their owners are provably gone. (Here every helper shares one
    # engine, so another process's `reap_orphans` may already have removed some.)
    left = await containers_of(docker_engine, host, killed[0])
    assert len(left) <= len(on_victim)
    for pid in killed[0]:
        owner = Owner(host=host, pid=pid)
        assert checkable(owner)
        # SIGKILL of the node's raylet reaches its workers asynchronously: bounded wait.
        async with asyncio.timeout(60):
            while process_alive(owner):
                await asyncio.sleep(0.1)
    for container_id in left:
        await docker_engine.remove_container(container_id)
    # Later tests must not be placed on the dead node before Ray has noticed it is dead.
    await wait_until_dead(victim_id)


async def wait_until_dead(node_id: str, limit: float = 120.0) -> None:
    """Until the GCS marks ``node_id`` dead (its health checks time out), at most ``limit``."""
    import ray

    async with asyncio.timeout(limit):
        while any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
            await asyncio.sleep(0.5)


async def test_cancelling_a_run_removes_every_actor_and_container(
    ray_cluster: Any, docker_engine: Any
) -> None:
    from llenvs_async.distributed import ray_env_factory, remote_restore

    saved, solution = await saved_states()
    factory = ray_env_factory(_envs.harbor)
    act = policy(solution)
    stepped: set[int] = set()
    parked = asyncio.Event()
    never = asyncio.Event()
    pids: set[int] = set()

    async def park() -> str:
        await never.wait()  # until the test cancels the run
        raise AssertionError("the parked round was never cancelled")

    def act_or_park(request: GenerationRequest) -> Any:
        if request.step > saved[0].step:
            stepped.add(request.rollout_index)
        if len(stepped) == 4 and not parked.is_set():
            # Every instance is restored and has stepped, none can have finished (the
            # solution has 6+ steps): the run parks in this round until it is cancelled.
            pids.update(p.placement.pid for p in factory._live.values())
            parked.set()
            return park()
        return act(request)

    runner = TrajectoryRunner(
        await _envs.harbor(), ScriptedBackend(act_or_park), env_factory=factory,
        restore_fn=remote_restore(harbor_restore),
    )  # fmt: skip
    run = asyncio.create_task(runner.run_batch_from_states([saved[0]] * 4, batch_size=4))
    signalled = asyncio.ensure_future(parked.wait())
    host = socket.gethostname()
    try:
        # hang guard only: a run that fails or ends first is reported by the assert below
        await asyncio.wait({run, signalled}, timeout=240, return_when=asyncio.FIRST_COMPLETED)
        assert parked.is_set() and not run.done(), run
        assert len(pids) == 4 and len(await containers_of(docker_engine, host, pids)) == 4
        assert not run.done(), run  # still parked mid-run when cancelled
    except BaseException:
        run.cancel()
        await asyncio.wait({run}, timeout=120)  # its teardown, before the failure is reported
        raise
    finally:
        signalled.cancel()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert factory.live == 0
    record = await ended_actors(factory.session)
    assert len(record) == factory.created == 4 and {a["Pid"] for a in record} == pids
    assert live_actors() == []
    assert await containers_of(docker_engine, host, pids) == []


async def test_a_killed_driver_leaves_no_actor_and_cleanup_removes_its_containers(
    ray_cluster: Any, docker_engine: Any
) -> None:
    from llenvs_async._ownership import SESSION_LABEL
    from llenvs_async.docker import reap_orphans

    await saved_states()  # builds the task images once, here
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.distributed._crashing_driver", ray_cluster.address,
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    pids = {int(p) for p in out.split()}
    assert len(pids) == 2
    # Ray kills the actors of a dead driver (bounded wait for that structural change)...
    host = socket.gethostname()
    owners = [Owner(host=host, pid=pid) for pid in pids]
    assert all(checkable(owner) for owner in owners)
    async with asyncio.timeout(120):
        while live_actors() or any(process_alive(owner) for owner in owners):
            await asyncio.sleep(0.5)
    # ... without a chance to close anything: the containers stay, labelled with their
    # dead owners, and the node's cleanup (`llenvs-async cleanup`) removes them.
    left = await containers_of(docker_engine, host, pids)
    assert 0 < len(left) <= 2  # (another process's cleanup on this shared engine may be first)
    listed = await docker_engine.list_containers({SESSION_LABEL: None})
    sessions = {c["Labels"][SESSION_LABEL] for c in listed if c["Id"] in left}
    reaped = [r for s in sessions for r in await reap_orphans(docker_engine, session=s)]
    assert {r.id for r in reaped} <= set(left)
    assert await containers_of(docker_engine, host, pids) == []
