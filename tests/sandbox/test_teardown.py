"""Teardown discipline of sandboxes: helper processes (``runsc exec``, ``tar``) are killed
when cut off or past their bound, exports clean up after themselves, the reaper finds
runsc by its absolute path, and a shell's exit status is read without polling."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import llenvs_async.host._host as host_module
from llenvs_async._ownership import SESSION_LABEL
from llenvs_async.docker import ContainerSpec, DockerEngine
from llenvs_async.errors import ContainerError
from llenvs_async.sandbox import Runsc, Sandbox
from llenvs_async.sandbox.bundle import ensure_rootfs
from llenvs_async.sandbox.reaper import kill_bundle_processes

# A stand-in for runsc whose every ``exec`` hangs (the exec's pid line first, as the real
# wrapper prints it); each invocation appends its pid to $FAKE_RUNSC_PIDS.
FAKE_RUNSC = """#!/bin/sh
echo $$ >>"$FAKE_RUNSC_PIDS"
[ "$2" = exec ] || exit 0
case "$*" in *llenvs-kill*) ;; *) printf '__llenvs_pid__4242\\n' ;; esac
exec sleep 300
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def fake_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    binary = tmp_path / "runsc"
    binary.write_text(FAKE_RUNSC)
    binary.chmod(0o755)
    monkeypatch.setenv("FAKE_RUNSC_PIDS", str(tmp_path / "pids"))
    runsc = Runsc(binary=str(binary), root=tmp_path / "state")
    config = {"process": {"cwd": "/", "env": []}}
    return Sandbox(runsc, "llenvs-fake", ContainerSpec(image="none"), config)


def helper_pids(sandbox: Sandbox) -> list[int]:
    pids = Path(os.environ["FAKE_RUNSC_PIDS"]).read_text().split()
    assert pids, "the fake runsc never ran"
    return [int(pid) for pid in pids]


async def test_a_signal_tree_cut_off_kills_its_runsc_exec(fake_sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(1):
            await fake_sandbox.signal_tree(1, "KILL")
    assert [pid for pid in helper_pids(fake_sandbox) if alive(pid)] == []


async def test_exec_past_its_timeout_is_bounded_when_signalling_hangs(
    fake_sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_module, "SIGNAL_TIMEOUT", 0.5)
    async with asyncio.timeout(60):  # unbounded before: the signalling exec never ended
        with pytest.raises(ContainerError, match="did not end when killed"):
            await fake_sandbox.exec("sleep 300", timeout=1.0)
    pids = helper_pids(fake_sandbox)
    assert len(pids) == 2  # the exec and one signalling exec, not a second try
    assert [pid for pid in pids if alive(pid)] == []


def test_the_reaper_kills_runsc_started_by_absolute_path(tmp_path: Path) -> None:
    bundle = tmp_path / "bundles" / "llenvs-cut-off"
    script = "import time; print('ready', flush=True); time.sleep(300)"
    stray = subprocess.Popen(  # argv[0] as runsc.argv gives it: the absolute path
        [str(tmp_path / "bin" / "runsc"), "-c", script, f"--bundle={bundle}"],
        executable=sys.executable, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert stray.stdout is not None and stray.stdout.readline() == "ready\n"  # exec'd
        assert kill_bundle_processes(bundle) == 1
        assert stray.wait(timeout=10) == -9
    finally:
        stray.kill()
        stray.wait()


class _StalledExport(DockerEngine):
    """Streams the first chunk of an export, then stalls (a slow daemon or a big image)."""

    def __init__(self) -> None:
        super().__init__()
        self.streaming = asyncio.Event()

    async def export_container(self, container_id: str, write: Any) -> None:
        async def first_then_stall(chunk: bytes) -> None:
            await write(chunk)
            self.streaming.set()
            await asyncio.Event().wait()

        await super().export_container(container_id, first_then_stall)


def tar_into(directory: Path) -> list[int]:
    """Our ``tar`` processes extracting into ``directory``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and argv[0] == b"tar" and str(directory).encode() in argv:
            found.append(int(proc.name))
    return found


async def test_a_cancelled_export_leaves_no_tar_tree_or_container(
    gvisor_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLENVS_GVISOR_CACHE", str(tmp_path))
    async with _StalledExport() as engine:
        export = asyncio.ensure_future(ensure_rootfs(engine, gvisor_image))
        async with asyncio.timeout(60):
            await engine.streaming.wait()
        partial = next((tmp_path / "rootfs").glob("*.partial-*"))
        (tar,) = tar_into(partial)
        export.cancel()
        with pytest.raises(asyncio.CancelledError):
            await export
        assert not alive(tar)
        assert list((tmp_path / "rootfs").iterdir()) == []
        assert await engine.list_containers({SESSION_LABEL: engine.session_id}) == []


@pytest.fixture
async def sandbox(runsc: Runsc, gvisor_image: str) -> AsyncIterator[Sandbox]:
    async with DockerEngine() as engine, await Sandbox.create(engine, ContainerSpec(
            image=gvisor_image)) as sandbox:  # fmt: skip
        yield sandbox


async def read_to_end(channel: Any) -> None:
    async with asyncio.timeout(60):
        while await channel.read_out() is not None:
            pass


async def test_a_shells_exit_status_is_read_once_without_polling(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    execs = 0
    exec_ = sandbox.exec

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal execs
        execs += 1
        return await exec_(*args, **kwargs)

    # It exits once told to: after the relay is attached (an exit before that is not
    # ended by the shell's parent: it found no relay yet).
    exited = await sandbox.open_channel(["/bin/sh", "-c", "read -r _; exit 7"])
    await exited.write_in(b"go\n")
    await read_to_end(exited)
    monkeypatch.setattr(sandbox, "exec", counted)
    assert await exited.exit_code() == 7
    assert execs == 1
    monkeypatch.undo()
    # The relay gone without the shell's parent recording a status: none, after one look.
    running = await sandbox.open_channel(["/bin/sh", "-c", "read -r _; echo ready; sleep 300"])
    await running.write_in(b"go\n")
    chunk = await running.read_out()  # the relay is attached (it carried our line)
    assert chunk is not None and b"ready" in chunk.data
    relay = f"{running.directory}/relay"
    assert (await sandbox.exec(["/bin/sh", "-c", f"kill -9 $(cat {relay})"])).ok
    await read_to_end(running)
    monkeypatch.setattr(sandbox, "exec", counted)
    execs = 0
    assert await running.exit_code() is None
    assert execs == 1
