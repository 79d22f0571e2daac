"""``ShellSession`` under every order in which its two streams can arrive.

Docker (and the gVisor relay) copy a shell's data channel and its own channel
independently, so start-up text, prompts, syntax errors and end marks may arrive before or
after the sentinel, and after the session went on to the next command. A scripted bash and
busybox (``_fake_shell``) deliver each possible interleaving in turn; every one must give
the same results: errors attributed to the command that caused them, nothing stale.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from llenvs_async.docker import ShellSession

from ._fake_shell import Explorer, FakeChannel, FakeHost, Kind, Message

SYNTAX: dict[Kind, str] = {
    "busybox": 'sh: syntax error: unexpected ")"\n',
    "bash": "bash: syntax error near unexpected token `)'\n",
}
Script = Callable[[ShellSession, Kind], Awaitable[None]]


async def check(shell: ShellSession, command: str, output: str, code: int) -> None:
    result = await shell.run(command, timeout=20)
    assert (result.output, result.exit_code, result.timed_out) == (output, code, False), result


async def first_command_error(shell: ShellSession, kind: Kind) -> None:
    """The issue's failure: the first command of an episode is a syntax error."""
    await check(shell, "echo )", SYNTAX[kind], 2)
    await check(shell, "echo hi", "hi\n", 0)


async def plain_exit_2(shell: ShellSession, kind: Kind) -> None:
    """Exit code 2 that is no syntax error, then one that is."""
    await check(shell, "ls /nope", "ls: cannot access '/nope': No such file or directory\n", 2)
    await check(shell, "echo )", SYNTAX[kind], 2)


async def prompts_then_error(shell: ShellSession, kind: Kind) -> None:
    """A multi-line command (its prompts on the shell's channel), then a syntax error."""
    await check(shell, "echo a\necho b", "a\nb\n", 0)
    await check(shell, "echo )", SYNTAX[kind], 2)


async def after_exit(shell: ShellSession, kind: Kind) -> None:
    """The first command of a new shell (after ``exit``, as after ``set -e`` or a timeout):
    the new shell's start-up text must not reach it."""
    gone = await shell.run("exit 3", timeout=20)
    assert gone.exit_code == 3 and gone.shell_restarted, gone
    await check(shell, "echo )", SYNTAX[kind], 2)


async def explore(kind: Kind, script: Script, *, relay: bool = False) -> tuple[int, FakeHost]:
    """Run ``script`` once per interleaving; the number of runs and the last host."""
    explorer = Explorer()
    host = FakeHost(kind, explorer.choose, relay=relay)
    while explorer.next_run():
        host = FakeHost(kind, explorer.choose, relay=relay)
        async with asyncio.timeout(10):
            shell = await ShellSession.start(host)
            try:
                await script(shell, kind)
            finally:
                await shell.aclose()
    return explorer.runs, host


@pytest.mark.parametrize("relay", [False, True], ids=["docker", "gvisor-relay"])
@pytest.mark.parametrize("kind", ["bash", "busybox"])
@pytest.mark.parametrize("script", [first_command_error, plain_exit_2, prompts_then_error])
async def test_every_interleaving_attributes_errors_to_their_command(
    kind: Kind, relay: bool, script: Script
) -> None:
    runs, host = await explore(kind, script, relay=relay)
    # The syntax error is checked once with ``sh -n`` (unfinished or invalid?); an exit
    # code 2 without one is read in full (its end mark arrived), so it needs no probe.
    assert host.shells[0].probes == 1
    assert runs >= 500, runs  # the streams really were interleaved in many ways (756+)


@pytest.mark.parametrize("kind", ["bash", "busybox"])
async def test_every_interleaving_after_a_restart(kind: Kind) -> None:
    runs, host = await explore(kind, after_exit)
    assert len(host.shells) == 2 and runs >= 500, runs


@pytest.mark.parametrize("first", [0, 1], ids=["data-first", "shell-channel-first"])
@pytest.mark.parametrize("kind", ["bash", "busybox"])
async def test_bytes_one_at_a_time(kind: Kind, first: int) -> None:
    """Every chunk split into single bytes: tags and marks arrive in pieces."""
    host = FakeHost(kind, lambda width: min(first, width - 1), split=True)
    async with asyncio.timeout(10):
        shell = await ShellSession.start(host)
        try:
            for script in (first_command_error, plain_exit_2, prompts_then_error):
                await script(shell, kind)
        finally:
            await shell.aclose()


class HeldChannel(FakeChannel):
    """Holds back the shell's own channel until ``release`` is set; ``starved`` is set
    whenever a read finds only held bytes."""

    def __init__(self, channel: FakeChannel) -> None:
        super().__init__(channel.shell)
        self.release = asyncio.Event()
        self.release.set()
        self.starved = asyncio.Event()

    async def read_out(self) -> Message | None:
        wire = self.shell.wire
        while not self.release.is_set():
            if wire.queues[1]:
                return Message(1, wire.queues[1].popleft())
            self.starved.set()
            changed = asyncio.ensure_future(wire.changes())
            released = asyncio.ensure_future(self.release.wait())
            await asyncio.wait([changed, released], return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            released.cancel()
        return await super().read_out()


async def held_shell(kind: Kind) -> tuple[ShellSession, HeldChannel]:
    host = FakeHost(kind, lambda width: 0)
    opened: list[HeldChannel] = []
    open_channel = host.open_channel

    async def open_held(argv: list[str]) -> HeldChannel:
        opened.append(HeldChannel(await open_channel(argv)))
        return opened[-1]

    host.open_channel = open_held  # type: ignore[method-assign]
    return await ShellSession.start(host), opened[0]


@pytest.mark.parametrize("kind", ["bash", "busybox"])
async def test_a_syntax_error_waits_for_its_end_mark(kind: Kind) -> None:
    """However late the shell's channel is, the error is waited for (no quiet window)."""
    shell, channel = await held_shell(kind)
    try:
        channel.release.clear()
        channel.starved.clear()
        running = asyncio.ensure_future(shell.run("echo )"))  # no timeout: no bound but the mark
        await channel.starved.wait()  # the sentinel is read; only the held channel is left
        assert not running.done()
        channel.release.set()
        result = await asyncio.wait_for(running, 10)
        assert (result.exit_code, result.output) == (2, SYNTAX[kind]), result
    finally:
        await shell.aclose()


@pytest.mark.parametrize("kind", ["bash", "busybox"])
async def test_a_missing_end_mark_falls_back_to_the_parser(kind: Kind) -> None:
    """The mark never comes within the command's timeout: ``sh -n`` names the error, the
    command is not reported as timed out, and the late bytes stay out of later commands."""
    shell, channel = await held_shell(kind)
    try:
        channel.release.clear()
        result = await shell.run("echo )", timeout=0.2)
        assert result.exit_code == 2 and not result.timed_out, result
        assert "syntax error" in result.output, result
        assert channel.shell.probes == 1
        channel.release.set()  # the late error, prompts and marks now arrive
        hi = await shell.run("echo hi", timeout=20)
        assert (hi.exit_code, hi.output) == (0, "hi\n"), hi
        bad = await shell.run("echo )", timeout=20)
        assert (bad.exit_code, bad.output) == (2, SYNTAX[kind]), bad
    finally:
        await shell.aclose()
