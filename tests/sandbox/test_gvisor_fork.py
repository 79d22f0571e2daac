"""SnapshotRestore(processes=True) on gVisor: 16 forks of one state keep the server the
prefix started and the shell's whole state; forks are isolated; nothing is left behind."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment, SnapshotRestore
from llenvs_async.errors import RestoreError
from llenvs_async.sandbox import Runsc, Sandbox
from llenvs_async.types import Action, State

FORKS = 16
PREFIX = (
    "mkdir -p /srv && echo served > /srv/index.html",
    "busybox httpd -p 127.0.0.1:8000 -h /srv",
    "greet() { echo hello-$1; }",
    "SECRET=s3cret",
    "alias hi='echo aliased'",
    "trap 'echo trapped' USR1",
    "set -f",
    "cd /srv",
)
PROBE = (
    'wget -qO- http://127.0.0.1:8000/index.html; greet x; echo "$SECRET"; hi; '
    "kill -USR1 $$; case $- in *f*) echo noglob;; esac; pwd; "
    "export -p | grep -c SECRET || true"
)
EXPECTED = "served\nhello-x\ns3cret\naliased\ntrapped\nnoglob\n/srv\n0\n"


async def play(env: HarborEnvironment, state: State, commands: Sequence[str]) -> State:
    for command in commands:
        state = (await env.step(state, Action(text=command))).next_state
    return state


async def prefix_state(adapter: HarborAdapter, tasks: Path, commands: Sequence[str]) -> State:
    async with await adapter.get_environment(tasks, max_steps=None) as env:
        return await play(env, await env.reset(0), commands)


async def test_sixteen_forks_keep_the_server_and_the_shell_state(
    runsc: Runsc, task_dir: Path
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        adapter = await stack.enter_async_context(HarborAdapter(runtime="gvisor"))
        restore = await stack.enter_async_context(SnapshotRestore(processes=True))
        state = await prefix_state(adapter, task_dir, PREFIX)
        envs = [
            await stack.enter_async_context(await adapter.get_environment(task_dir, None))
            for _ in range(FORKS)
        ]
        restored = await asyncio.gather(*(restore(env, state) for env in envs))
        assert restore.stats.replays == 1 and restore.stats.snapshots == 1
        assert restore.stats.forks == FORKS - 1 and restore.stats.fallbacks == 0
        methods = sorted(s.info["restore"]["method"] for s in restored)
        assert methods == ["checkpoint"] * (FORKS - 1) + ["replay"]
        assert all(isinstance(env.container, Sandbox) for env in envs)
        assert len({env.container.id for env in envs if env.container}) == FORKS
        outputs = await asyncio.gather(*(env.probe(PROBE) for env in envs))
        assert outputs == [EXPECTED.rstrip("\n")] * FORKS
        # Writes stay in their fork: each sees its own file only, and the page unchanged.
        await asyncio.gather(*(env.probe(f"echo {i} > mine-{i}") for i, env in enumerate(envs)))
        seen = await asyncio.gather(*(env.probe("ls | grep mine | tr '\\n' ' '") for env in envs))
        assert seen == [f"mine-{i} " for i in range(FORKS)]
        # The forked episodes continue: a step runs in the restored shell.
        step = await envs[3].step(restored[3], Action(text="greet step; echo $SECRET"))
        assert step.next_state.observation.text == "hello-step\ns3cret"


async def test_processes_without_gvisor_is_a_clear_error(task_dir: Path) -> None:
    async with HarborAdapter() as adapter, SnapshotRestore(processes=True) as restore:
        state = await prefix_state(adapter, task_dir, ("SECRET=1",))
        async with await adapter.get_environment(task_dir, None) as env:
            with pytest.raises(RestoreError, match=r"gVisor runtime.*runs on 'runc'"):
                await restore(env, state)
            assert env.container is None  # refused before anything started


async def test_nothing_left_after_a_failed_replay(runsc: Runsc, task_dir: Path) -> None:
    async with HarborAdapter(runtime="gvisor") as adapter:
        state = await prefix_state(adapter, task_dir, ("echo one > /f",))
        bad = replace(state, actions=(*state.actions, Action(text="SUBMIT")), step=state.step + 1)
        async with SnapshotRestore(processes=True) as restore:
            envs = [await adapter.get_environment(task_dir, None) for _ in range(4)]
            try:
                results = await asyncio.gather(
                    *(restore(env, bad) for env in envs), return_exceptions=True
                )
            finally:
                for env in envs:
                    await env.aclose()
        assert all(isinstance(r, RestoreError) for r in results), results
        assert "submits" in str(results[0])


async def test_nothing_left_after_a_cancel(runsc: Runsc, task_dir: Path) -> None:
    async with HarborAdapter(runtime="gvisor") as adapter:
        state = await prefix_state(adapter, task_dir, ("sleep 600 &", "echo started"))
        async with SnapshotRestore(processes=True) as restore:
            envs = [await adapter.get_environment(task_dir, None) for _ in range(4)]
            try:
                lead = asyncio.ensure_future(restore(envs[0], state))
                while not restore.stats.snapshots:  # the checkpoint exists: cancel the forks
                    await asyncio.sleep(0.05)
                forks = [asyncio.ensure_future(restore(env, state)) for env in envs[1:]]
                await asyncio.sleep(0)
                for task in (lead, *forks):
                    task.cancel()
                await asyncio.gather(lead, *forks, return_exceptions=True)
            finally:
                for env in envs:
                    await env.aclose()
