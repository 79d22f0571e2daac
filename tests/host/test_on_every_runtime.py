"""What every host does the same on every runtime: exec with combined output and exit codes,
a timeout or a cancellation that kills the command's whole tree, files in and out, shells
closed with their box, and capabilities that are either there or a clear error."""

from __future__ import annotations

import asyncio

import pytest

from llenvs_async.errors import EnvError
from llenvs_async.host import Host

# Lists the command names of the box's processes (the listing's own shell aside).
PROCESSES = "for d in /proc/[0-9]*; do read -r c < $d/comm 2>/dev/null && echo $c; done"


async def sleepers(box: Host) -> int:
    """How many ``sleep`` processes the box runs (its own keep-alive one included)."""
    return (await box.exec(PROCESSES)).output.split().count("sleep")


async def test_exec_combines_the_output_and_keeps_the_exit_code(box: Host) -> None:
    result = await box.exec("echo out; echo err >&2; exit 3")
    assert result.exit_code == 3 and not result.timed_out
    assert sorted(result.output.split()) == ["err", "out"]
    assert (await box.exec(["/bin/echo", "a b"])).output == "a b\n"


async def test_a_timeout_kills_the_whole_tree(box: Host) -> None:
    before = await sleepers(box)
    result = await box.exec("sleep 300 & sleep 301; echo never", timeout=1.0)
    assert result.timed_out and "never" not in result.output
    assert await sleepers(box) == before


async def test_a_cancelled_exec_kills_the_whole_tree(box: Host) -> None:
    before = await sleepers(box)
    task = asyncio.create_task(box.exec("sleep 300 & sleep 301"))
    for _ in range(200):  # until both are running (no fixed sleep: poll what the box runs)
        if await sleepers(box) == before + 2:
            break
    assert await sleepers(box) == before + 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await sleepers(box) == before


async def test_files_go_in_and_come_out(box: Host) -> None:
    await box.put_files({"/data/a.txt": "héllo", "/data/deep/b.bin": b"\x00\x01"})
    assert await box.get_file("/data/a.txt") == "héllo".encode()
    assert (await box.exec("cat /data/deep/b.bin | wc -c")).output.strip() == "2"


async def test_a_shell_keeps_its_state_and_closes_with_its_box(box: Host) -> None:
    shell = await box.shell()
    await shell.run("cd /tmp; export X=7")
    assert (await shell.run("echo $X $PWD")).output == "7 /tmp\n"
    await box.aclose()
    assert shell.closed


async def test_a_capability_is_there_or_a_clear_error(box: Host) -> None:
    if "pids" in box.capabilities:
        current, limit = await box.pids()
        assert current >= 1 and limit == 128
    else:
        with pytest.raises(EnvError, match="'pids' capability"):
            await box.pids()
    if "commit" not in box.capabilities:
        with pytest.raises(EnvError, match="'commit' capability"):
            await box.commit("llenvs-test/never")
