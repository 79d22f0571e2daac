"""A gVisor sandbox as a shell-task host: persistent shell, exit codes, timeouts, files,
limits, no network; no sandbox left after SIGINT; ``cleanup`` reaps a killed owner's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llenvs_async.docker import ContainerSpec, DockerEngine
from llenvs_async.sandbox import Runsc, Sandbox, reap_orphan_sandboxes
from llenvs_async.sandbox.bundle import HOST_TASKS_BASE, HOST_TASKS_PER_PID
from llenvs_async.sandbox.channel import SHELL_DIR, START_SCRIPT
from llenvs_async.sandbox.reaper import list_sandboxes

ROOT = Path(__file__).resolve().parents[2]
# Starts a gVisor episode, says so, then waits to be interrupted.
CHILD = """
import asyncio, sys
from llenvs_async.adapters.harbor import HarborAdapter
async def main():
    async with HarborAdapter(runtime="gvisor") as adapter:
        async with await adapter.get_environment(sys.argv[1], max_steps=None) as env:
            await env.reset(0)
            print("ready", flush=True)
            await asyncio.sleep(3600)
asyncio.run(main())
"""


def owned_by(runsc: Runsc, pid: int) -> list[str]:
    return [
        str(item["id"])
        for item in list_sandboxes(runsc)
        if (item.get("annotations") or {}).get("llenvs.owner", "").endswith(f":{pid}")
    ]


def start_child(task_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(task_dir)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


async def test_shell_exec_files_limits_and_no_network(runsc: Runsc, gvisor_image: str) -> None:
    spec = ContainerSpec(image=gvisor_image, pids_limit=64, memory_bytes=256 << 20)
    async with DockerEngine() as engine, await Sandbox.create(engine, spec) as sandbox:
        shell = await sandbox.shell()
        assert (await shell.run("cd /tmp; X=1; echo $X $PWD")).output == "1 /tmp\n"
        failed = await shell.run("exit 3")
        assert failed.exit_code == 3 and failed.shell_restarted
        slow = await shell.run("sleep 30", timeout=0.5)
        assert slow.timed_out and (await shell.run("echo alive")).output == "alive\n"
        assert (await sandbox.exec("echo out; exit 4")).exit_code == 4
        await sandbox.put_files({"/data/a.txt": "content"})
        assert await sandbox.get_file("/data/a.txt") == b"content"
        interfaces = (await sandbox.exec("ls /sys/class/net 2>/dev/null || ifconfig -a")).output
        assert "eth" not in interfaces
        cgroup = Path(f"/sys/fs/cgroup/pids/{sandbox.id}/pids.max")
        if cgroup.exists():  # cgroup v1 hosts (this machine kind): runsc applied the limit
            assert cgroup.read_text().strip() == str(64 * HOST_TASKS_PER_PID + HOST_TASKS_BASE)


async def test_a_shell_that_exits_before_its_relay_attaches_ends_the_relay(
    runsc: Runsc, gvisor_image: str
) -> None:
    """The shell is gone before the relay starts (waited for: its status is on file), so
    nobody is left to end the relay but the relay itself: its streams must still end."""
    spec = ContainerSpec(image=gvisor_image)
    async with DockerEngine() as engine, await Sandbox.create(engine, spec) as sandbox:
        directory = f"{SHELL_DIR}/early"
        started = await sandbox.exec(
            ["/bin/sh", "-c", START_SCRIPT, "sh", directory, "/bin/sh", "-c", "exit 5"]
        )
        assert started.ok, started.output
        async with asyncio.timeout(30):
            while not (await sandbox.exec(["test", "-e", f"{directory}/rc"])).ok:
                await asyncio.sleep(0.05)
        channel = await sandbox.attach_channel(directory)
        async with asyncio.timeout(30):  # without the relay's own check: forever
            assert await channel.read_out() is None
            assert await channel.exit_code() == 5


def test_sigint_leaves_no_sandbox(runsc: Runsc, task_dir: Path) -> None:
    child = start_child(task_dir)
    assert len(owned_by(runsc, child.pid)) == 1
    child.send_signal(signal.SIGINT)
    child.wait(timeout=60)
    assert owned_by(runsc, child.pid) == []


def test_cleanup_reaps_the_sandboxes_of_a_killed_owner(runsc: Runsc, task_dir: Path) -> None:
    child = start_child(task_dir)
    child.kill()  # no atexit, no aclose: the sandbox is an orphan now
    child.wait(timeout=30)
    assert len(owned_by(runsc, child.pid)) == 1
    reaped = reap_orphan_sandboxes(runsc)
    assert [r.kind for r in reaped if r.owner.endswith(f":{child.pid}")] == ["sandbox"]
    assert owned_by(runsc, child.pid) == []


def test_missing_runsc_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from llenvs_async.adapters.harbor import HarborAdapter
    from llenvs_async.errors import GvisorUnavailableError

    monkeypatch.setenv("LLENVS_RUNSC", "/nonexistent/runsc")
    with pytest.raises(GvisorUnavailableError, match=r"runsc is not installed.*ensure-gvisor"):
        HarborAdapter(runtime="gvisor")


async def test_docker_environment_runs_in_a_sandbox(runsc: Runsc, gvisor_image: str) -> None:
    from llenvs_async.docker import DockerEnvironment
    from llenvs_async.types import Action

    env = DockerEnvironment(image=gvisor_image, verify_command="test -f /done", runtime="gvisor")
    async with env:
        state = await env.reset()
        assert isinstance(env.container, Sandbox)
        state = (await env.step(state, Action(text="touch /done && echo made"))).next_state
        assert state.observation.text == "made"
        result = await env.step(state, Action(text="SUBMIT"))
        assert result.reward == 1.0
    assert env.container is None


async def test_an_example_harbor_task_is_solved_and_verified_in_gvisor(runsc: Runsc) -> None:
    from llenvs_async.adapters.harbor import HarborAdapter
    from llenvs_async.types import Action

    tasks = ROOT / "examples" / "tasks"
    async with HarborAdapter(runtime="gvisor") as adapter:
        _, task = (await adapter.get_dataset(tasks)).resolve("csv-totals")
        async with await adapter.get_environment(tasks, max_steps=None) as env:
            state = await env.reset("csv-totals")
            assert isinstance(env.container, Sandbox)
            for command in task.solution_commands():
                state = (await env.step(state, Action(text=command))).next_state
            result = await env.step(state, Action(text="SUBMIT"))
    assert result.reward == 1.0


def test_a_start_cut_off_before_runsc_recorded_it_is_killed(runsc: Runsc) -> None:
    from llenvs_async._ownership import current_owner
    from llenvs_async.sandbox.reaper import remove_own_sandboxes_sync

    bundle = runsc.bundles / "llenvs-cut-off-start"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"annotations": current_owner().labels}))
    # A process like runsc-sandbox of that bundle, unknown to `runsc list`.
    stray = subprocess.Popen(
        ["runsc-sandbox", "-c", "import time; time.sleep(300)", f"--bundle={bundle}"],
        executable=sys.executable,
    )
    try:
        assert "llenvs-cut-off-start" in remove_own_sandboxes_sync(runsc)
        assert stray.wait(timeout=10) == -signal.SIGKILL
        assert not bundle.exists()
    finally:
        stray.kill()


async def test_a_network_is_refused_before_anything_starts() -> None:
    from llenvs_async.errors import EnvError

    spec = ContainerSpec(image="no-such-image:never-pulled", network_mode="bridge")
    with pytest.raises(EnvError, match=r"without a network.*network_mode='bridge'"):
        await Sandbox.create(DockerEngine(), spec)


async def test_what_only_a_docker_container_hosts_is_refused_naming_the_runtime(
    runsc: Runsc, tmp_path: Path
) -> None:
    from llenvs_async.adapters.harbor import HarborAdapter
    from llenvs_async.errors import EnvError

    tasks = ROOT / "examples" / "tasks"
    async with HarborAdapter(runtime="gvisor", artifacts_dir=tmp_path) as adapter:
        env = await adapter.get_environment(tasks, max_steps=None)
        async with env:
            with pytest.raises(EnvError, match=r"runtime='gvisor' does not support artifacts_dir"):
                await env.reset("csv-totals")
            assert env.container is None
