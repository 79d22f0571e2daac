"""SnapshotRestore(processes=True) on gVisor: 16 forks of one state keep the server the
prefix started and the shell's whole state, a background writer included; forks are
isolated; an image this runsc cannot stat in is reported; nothing is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from llenvs_async._ownership import current_owner
from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment, SnapshotRestore
from llenvs_async.docker import BASE_IMAGE, DockerEngine
from llenvs_async.errors import ContainerError, RestoreError
from llenvs_async.sandbox import Runsc, Sandbox
from llenvs_async.sandbox import sandbox as sandbox_module
from llenvs_async.sandbox.fork import SandboxCheckpoint
from llenvs_async.types import Action, State
from tests._support import require_built_images

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
# A writer that keeps rewriting a file in the in-memory overlay while the checkpoint is taken
# (a counter, so each fork can show it continues from where the checkpoint left it).
WRITER = (
    "(n=0; while true; do n=$((n+1)); echo $n > /tmp/beat; sleep 0.05; done) >/dev/null 2>&1 &",
    "greet() { echo fn-$1; }; SECRET=unexported-ok; cd /tmp",
)
# In a fork: /tmp lists, the beat is a number that advances within 10 s (the writer runs on
# from its checkpointed count), and the shell's function, variable and cwd are there. A read
# between the writer's truncate and its write sees an empty file: read until it is not.
WRITER_PROBE = (
    "ls /tmp >/dev/null && echo ls-ok; "
    'beat() { v=; i=0; while [ -z "$v" ] && [ $i -lt 200 ]; do v=$(cat /tmp/beat); i=$((i+1)); '
    'done; echo "$v"; }; a=$(beat); i=0; '
    'while [ "$(beat)" = "$a" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; '
    'b=$(beat); [ "$b" -gt "$a" ] && echo "beat-advances $a"; greet x; echo "$SECRET"; pwd'
)
WRITER_SOUND = r"ls-ok\nbeat-advances [1-9][0-9]*\nfn-x\nunexported-ok\n/tmp"
# Forks per run x runs: the reported rate (2 broken forks of 24) would leave all 48 clean
# with probability (22/24)^48 < 2%; each run costs about 45 s on 2 loaded cores.
WRITER_RUNS = 3


def own_bundles(runsc: Runsc) -> set[str]:
    """The bundles of this process's sandboxes (written before ``runsc run``/``restore``)."""
    here = current_owner().label
    found = set()
    for bundle in runsc.bundles.iterdir():
        with contextlib.suppress(OSError):  # removed meanwhile, or not yet written
            if here in (bundle / "config.json").read_text():
                found.add(bundle.name)
    return found


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


@pytest.mark.timeout(600)  # about 130 s here; twice that under load still fits
async def test_sixteen_forks_of_a_background_writer_keep_a_sound_filesystem(
    runsc: Runsc, task_dir: Path
) -> None:
    for _ in range(WRITER_RUNS):
        async with contextlib.AsyncExitStack() as stack:
            adapter = await stack.enter_async_context(HarborAdapter(runtime="gvisor"))
            restore = await stack.enter_async_context(SnapshotRestore(processes=True))
            state = await prefix_state(adapter, task_dir, WRITER)
            envs = [
                await stack.enter_async_context(await adapter.get_environment(task_dir, None))
                for _ in range(FORKS)
            ]
            await asyncio.gather(*(restore(env, state) for env in envs))
            assert restore.stats.forks == FORKS - 1 and restore.stats.fallbacks == 0
            outputs = await asyncio.gather(*(env.probe(WRITER_PROBE) for env in envs))
            unsound = [out for out in outputs if not re.fullmatch(WRITER_SOUND, out)]
            assert not unsound, unsound


async def test_an_image_whose_ls_this_runsc_breaks_is_reported_once(
    runsc: Runsc, task_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runsc before gVisor release-20231030 fails GNU ls/stat (coreutils >= 9) with EINVAL on
    every path, in fresh sandboxes and forks alike: logged once per image; newer ones run it."""
    async with DockerEngine() as engine:
        await require_built_images(engine, BASE_IMAGE)
    (task_dir / "gvisor-fork" / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\n")
    monkeypatch.setattr(sandbox_module, "_stat_checked", set())  # not yet probed in this process
    version = (await runsc.call("--version")).partition("\n")[0]
    released = re.search(r"(\d{8})\.\d+$", version)
    assert released, version
    fixed = int(released[1]) >= 20231030
    async with HarborAdapter(runtime="gvisor") as adapter:
        for _ in range(2):
            async with await adapter.get_environment(task_dir, None) as env:
                await env.reset(0)
                listed = await env.probe("ls -d /tmp")
                assert (listed == "/tmp") if fixed else ("Invalid argument" in listed), listed
    warned = [r.getMessage() for r in caplog.records if "AT_NO_AUTOMOUNT" in r.getMessage()]
    assert len(warned) == (0 if fixed else 1), warned
    assert fixed or ("release-20231030" in warned[0] and version in warned[0])


async def test_processes_without_gvisor_is_a_clear_error(task_dir: Path) -> None:
    async with HarborAdapter() as adapter, SnapshotRestore(processes=True) as restore:
        state = await prefix_state(adapter, task_dir, ("SECRET=1",))
        async with await adapter.get_environment(task_dir, None) as env:
            with pytest.raises(RestoreError, match=r"checkpoints them .'gvisor'.*runs on 'runc'"):
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
                async with asyncio.timeout(120):  # the checkpoint exists (the lead still runs)
                    while not restore.stats.snapshots:
                        assert not lead.done(), lead
                        await asyncio.sleep(0.05)
                before = own_bundles(runsc)
                forks = [asyncio.ensure_future(restore(env, state)) for env in envs[1:]]
                async with asyncio.timeout(120):  # forks are restoring (the lead adds one bundle)
                    while len(own_bundles(runsc) - before) < len(forks):
                        await asyncio.sleep(0.05)
                for task in (lead, *forks):
                    task.cancel()
                async with asyncio.timeout(120):
                    await asyncio.gather(lead, *forks, return_exceptions=True)
            finally:
                for env in envs:
                    await env.aclose()


def failing_restores(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[int]:
    """Make the first ``failures`` restores fail as runsc's crash did; the calls made."""
    real = SandboxCheckpoint._restore
    calls: list[int] = []

    async def restore(self: SandboxCheckpoint, labels: Mapping[str, str]) -> Sandbox:
        calls.append(1)
        if len(calls) <= failures:
            raise ContainerError("runsc restore llenvs-x failed (exit 128): panic: injected")
        return await real(self, labels)

    monkeypatch.setattr(SandboxCheckpoint, "_restore", restore)
    return calls


async def test_a_restore_runsc_fails_is_tried_once_more(
    runsc: Runsc, task_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = failing_restores(monkeypatch, failures=1)
    async with HarborAdapter(runtime="gvisor") as adapter:
        state = await prefix_state(adapter, task_dir, ("SECRET=kept",))
        async with SnapshotRestore(processes=True) as restore:
            envs = [await adapter.get_environment(task_dir, None) for _ in range(3)]
            try:
                await asyncio.gather(*(restore(env, state) for env in envs))
                outputs = await asyncio.gather(*(env.probe("echo $SECRET") for env in envs))
            finally:
                for env in envs:
                    await env.aclose()
    assert outputs == ["kept"] * 3
    assert restore.stats.forks == 2 and restore.stats.fallbacks == 0
    assert len(calls) == 4  # the lead's resume and two forks, one of them twice
    retried = [r.getMessage() for r in caplog.records if "trying once more" in r.getMessage()]
    assert len(retried) == 1 and "panic: injected" in retried[0], retried


async def test_a_lead_whose_restore_fails_twice_raises_it_and_leaves_nothing(
    runsc: Runsc, task_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lead's own resume fails: it raises runsc's error (not a task group's), the
    waiting restore replays instead, and no sandbox or checkpoint stays (the fixture)."""
    failing_restores(monkeypatch, failures=2)
    async with HarborAdapter(runtime="gvisor") as adapter:
        state = await prefix_state(adapter, task_dir, ("SECRET=kept",))
        async with SnapshotRestore(processes=True) as restore:
            envs = [await adapter.get_environment(task_dir, None) for _ in range(2)]
            try:
                results = await asyncio.gather(
                    *(restore(env, state) for env in envs), return_exceptions=True
                )
            finally:
                for env in envs:
                    await env.aclose()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and type(errors[0]) is ContainerError, results
    assert "panic: injected" in str(errors[0])
    replayed = [r for r in results if isinstance(r, State)]
    assert [s.info["restore"]["method"] for s in replayed] == ["replay"]
    assert "panic: injected" in replayed[0].info["restore"]["fallback_reason"]
