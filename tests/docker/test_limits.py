"""Safe defaults: resource limits contain abuse, no network, labels and security options."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path

from llenvs_async._ownership import OWNER_LABEL, SESSION_LABEL, current_owner
from llenvs_async.docker import DEFAULT_CAP_DROP, DockerEngine

from .conftest import ContainerFactory, ShellFactory

PIDS_LIMIT = 64
_CAP_BITS = {"NET_RAW": 13, "MKNOD": 27, "SYS_CHROOT": 18, "SETFCAP": 31, "CHOWN": 0, "KILL": 5}


def _pids_cgroup(pid: int) -> Path:
    """The host directory of the pids cgroup ``pid`` is in (cgroup v1 or v2): the kernel's
    own counters, read as files (no engine round trip, nothing sampled)."""
    unified: Path | None = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids", path.lstrip("/"))
        if controllers == "":
            unified = Path("/sys/fs/cgroup", path.lstrip("/"))
    assert unified is not None, f"process {pid} is in no pids cgroup"
    return unified


def _pids(cgroup: Path, name: str) -> int:
    """``pids.current``/``pids.peak``; for ``pids.events``, the forks refused at the limit."""
    text = (cgroup / name).read_text()
    if name == "pids.events":  # "max N" (cgroup v2 may add other lines)
        return next(
            int(n) for key, n in (line.split() for line in text.splitlines()) if key == "max"
        )
    return int(text)


async def _wait_for(cgroup: Path, name: str, done: Callable[[int], bool]) -> int:
    """Poll a counter until ``done`` holds (bounded by the caller's timeout)."""
    while not done(value := _pids(cgroup, name)):
        await asyncio.sleep(0.01)
    return value


async def test_fork_bomb_is_contained_by_the_pids_limit(
    base_image: str, make_shell: ShellFactory
) -> None:
    shell = await make_shell(image=base_image, pids_limit=PIDS_LIMIT)
    cgroup = _pids_cgroup((await shell.container.inspect())["State"]["Pid"])
    assert _pids(cgroup, "pids.max") == PIDS_LIMIT

    async def fork_on_the_host_at_the_limit() -> tuple[int, int, int]:
        # The kernel counts every fork it refused at the limit: the first one proves the
        # bomb is there (a file read, so no sample can miss it). Can the host still fork?
        await _wait_for(cgroup, "pids.events", lambda refused: refused > 0)
        peak, current = _pids(cgroup, "pids.peak"), _pids(cgroup, "pids.current")
        return peak, current, subprocess.run(["true"], check=False).returncode

    async with asyncio.timeout(60), asyncio.TaskGroup() as tg:
        host = tg.create_task(fork_on_the_host_at_the_limit())
        result = await shell.run("bomb() { bomb | bomb; }; bomb", timeout=4)
        forked_while_the_bomb_ran = host.done()
        host.cancel()
    assert result.timed_out
    assert "Resource temporarily unavailable" in result.output
    # The host forked while the bomb was at the limit, before the interrupt ended it.
    assert forked_while_the_bomb_ran
    peak, current, returncode = host.result()
    assert (current >= PIDS_LIMIT - 8, returncode) == (True, 0), (current, returncode)
    # Forks stop exactly at the limit (the kernel's high-water mark, not a sample, taken
    # before any interrupt exec joined); only docker execs (our interrupt) join beyond it.
    assert peak == PIDS_LIMIT
    assert PIDS_LIMIT <= _pids(cgroup, "pids.peak") <= PIDS_LIMIT + 8
    assert (await shell.run("echo alive")).output == "alive\n"
    # The killed bomb's orphans are reaped by docker-init, asynchronously: wait (bounded)
    # until only init, keepalive and the shell are left.
    async with asyncio.timeout(30):
        await _wait_for(cgroup, "pids.current", lambda current: current <= 4)


async def test_memory_hog_is_killed_by_the_memory_limit(
    base_image: str, make_shell: ShellFactory
) -> None:
    shell = await make_shell(image=base_image, memory_bytes=128 << 20)
    await shell.run("export KEEP=1")
    async with asyncio.timeout(60):
        result = await shell.run("python3 -c \"b = b'x' * (1 << 30); print('survived')\"")
    assert (result.exit_code, result.output) == (137, "")  # SIGKILL by the OOM killer
    assert not result.shell_restarted
    assert (await shell.run("echo $KEEP")).output == "1\n"
    assert (await shell.container.inspect())["State"]["Running"]


async def test_no_network_by_default(base_image: str, make_container: ContainerFactory) -> None:
    container = await make_container(image=base_image)
    info = await container.inspect()
    assert info["HostConfig"]["NetworkMode"] == "none"
    assert info["Config"].get("NetworkDisabled") is True
    interfaces = (await container.exec("tail -n +3 /proc/net/dev")).output
    assert [line.split(":")[0].strip() for line in interfaces.splitlines()] == ["lo"]
    probe = (
        "import socket\n"
        "try:\n socket.create_connection(('192.0.2.1', 80), timeout=3)\n"
        "except OSError as e: print(type(e).__name__, e.errno)"
    )
    result = await container.exec(["python3", "-c", probe])
    assert result.output.split()[-1] == "101"  # ENETUNREACH: no route at all


async def test_labels_and_security_defaults(
    engine: DockerEngine, make_container: ContainerFactory
) -> None:
    container = await make_container(pids_limit=100, memory_bytes=256 << 20, cpus=0.5)
    info = await container.inspect()
    labels, host = info["Config"]["Labels"], info["HostConfig"]
    assert labels[OWNER_LABEL] == current_owner().label
    assert labels[SESSION_LABEL] == engine.session_id
    assert host["Privileged"] is False and host["Init"] is True
    assert set(host["CapDrop"]) == set(DEFAULT_CAP_DROP)
    assert any(opt.startswith("no-new-privileges") for opt in host["SecurityOpt"])
    assert (host["PidsLimit"], host["Memory"], host["MemorySwap"]) == (100, 256 << 20, 256 << 20)
    assert host["NanoCpus"] == 500_000_000
    assert not host.get("Binds") and not info["Mounts"]
    status = (await container.exec("cat /proc/1/status")).output
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["NoNewPrivs"].strip() == "1"
    effective = int(fields["CapEff"], 16)
    for name, bit in _CAP_BITS.items():
        assert bool(effective & (1 << bit)) == (name not in DEFAULT_CAP_DROP), name
    assert "docker-init" in (await container.exec("cat /proc/1/cmdline")).output
