"""The exec rule ``Host`` writes once for every runtime, over a scripted carrier: on a
timeout, an error or a cancellation the command's tree is killed (once), the carrier is let
go, and the caller sees the original error; a missing capability is a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

from llenvs_async.docker import Container
from llenvs_async.docker.runtime import RUNC
from llenvs_async.errors import ContainerError, EnvError
from llenvs_async.host import KILL_TREE_SCRIPT, Carrier, Host, ShellChannel
from llenvs_async.sandbox import GVISOR, Sandbox, SandboxProcessFork

PID = 4242


class _Carrier:
    """Output chunks, then (unless ``hang``) the end; records that it was let go."""

    def __init__(self, chunks: Sequence[bytes], *, hang: bool = False, fail: bool = False):
        self.chunks, self.hang, self.fail = list(chunks), hang, fail
        self.closed = 0

    async def read(self) -> tuple[bytes, bool] | None:
        if self.chunks:
            return self.chunks.pop(0), True
        if self.fail:
            raise ContainerError("the stream broke", container_id="fake")
        if self.hang:
            await asyncio.Event().wait()
        return None

    async def exit_code(self) -> int | None:
        return 0

    async def close(self) -> None:
        self.closed += 1
        self.hang = False  # a killed process's output ends


class _Host(Host):
    def __init__(self, command: _Carrier, *, kill_fails: bool = False) -> None:
        self.id, self._closed = "fake", False
        self.command, self.kill_fails = command, kill_fails
        self.kills: list[tuple[str, ...]] = []

    @property
    def short_id(self) -> str:
        return "fake"

    async def _spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
        stdin: bytes | None = None,
    ) -> Carrier:
        if KILL_TREE_SCRIPT in argv:
            self.kills.append(tuple(argv[4:6]))  # the signal and the root pid
            self.command.hang = False
            if self.kill_fails:
                raise ContainerError("no process can start", container_id="fake")
            return _Carrier([b"3\n"])
        return self.command

    async def put_archive(self, directory: str, tar_bytes: bytes) -> None:
        raise NotImplementedError

    async def open_channel(self, argv: list[str]) -> ShellChannel:
        raise NotImplementedError

    async def get_file(self, path: str) -> bytes:
        raise NotImplementedError


def _marked(*rest: bytes) -> list[bytes]:
    return [f"__llenvs_pid__{PID}\n".encode(), *rest]


async def test_a_command_runs_to_its_end_without_a_kill() -> None:
    host = _Host(_Carrier(_marked(b"hello\n")))
    result = await host.exec("echo hello")
    assert (result.output, result.exit_code, result.timed_out) == ("hello\n", 0, False)
    assert host.kills == [] and host.command.closed == 1


async def test_a_timeout_kills_the_tree_once_and_keeps_the_output() -> None:
    host = _Host(_Carrier(_marked(b"partial\n"), hang=True))
    result = await host.exec("sleep 100", timeout=0.05)
    assert result.timed_out and result.output == "partial\n"
    assert host.kills == [("KILL", str(PID))] and host.command.closed == 1


async def test_a_cancelled_exec_kills_the_tree_and_lets_the_carrier_go() -> None:
    host = _Host(_Carrier(_marked(), hang=True))
    task = asyncio.create_task(host.exec("sleep 100"))
    while host.command.chunks:  # the pid mark is read: the command runs
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert host.kills == [("KILL", str(PID))] and host.command.closed == 1


async def test_an_error_mid_command_kills_the_tree_and_stays_the_error_raised() -> None:
    host = _Host(_Carrier(_marked(), fail=True), kill_fails=True)
    with pytest.raises(ContainerError, match="the stream broke"):
        await host.exec("cat /dev/zero")
    assert host.kills == [("KILL", str(PID))] and host.command.closed == 1


async def test_a_command_that_cannot_be_killed_after_its_timeout_is_an_error() -> None:
    host = _Host(_Carrier(_marked(), hang=True), kill_fails=True)
    with pytest.raises(ContainerError, match="did not end when killed after its timeout"):
        await host.exec("sleep 100", timeout=0.05)
    assert host.command.closed == 1


async def test_a_missing_capability_is_named() -> None:
    host = _Host(_Carrier([]))
    with pytest.raises(EnvError, match=r"_Host fake cannot commit .*'commit' capability"):
        await host.commit("repo")
    with pytest.raises(EnvError, match=r"'pids' capability"):
        await host.pids()


def test_runtimes_declare_their_boxes_capabilities() -> None:
    assert issubclass(Container, Host) and issubclass(Sandbox, Host)
    assert RUNC.capabilities == Container.capabilities >= {"commit", "warm_pool", "pids"}
    assert GVISOR.capabilities == Sandbox.capabilities == {"checkpoint"}


def test_a_runtime_offers_its_process_fork_by_its_capability() -> None:
    """The fork of whole boxes comes from the runtime (no import of gVisor's by name); one
    without ``checkpoint`` says so."""
    fork = GVISOR.process_fork(timeout=5.0)
    assert isinstance(fork, SandboxProcessFork) and fork.runtime == "gvisor" and fork.timeout == 5
    with pytest.raises(EnvError, match=r"runc boxes are not checkpointed.*'checkpoint'"):
        RUNC.process_fork(timeout=5.0)
