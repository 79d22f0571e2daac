"""Safe defaults: resource limits contain abuse, no network, labels and security options."""

from __future__ import annotations

import asyncio
import subprocess

from llenvs_async.docker import DEFAULT_CAP_DROP, DockerEngine
from llenvs_async.docker.ownership import OWNER_LABEL, SESSION_LABEL, current_owner

from .conftest import ContainerFactory, ShellFactory

PIDS_LIMIT = 64
_CAP_BITS = {"NET_RAW": 13, "MKNOD": 27, "SYS_CHROOT": 18, "SETFCAP": 31, "CHOWN": 0, "KILL": 5}


async def _container_pids(engine: DockerEngine, container_id: str) -> int:
    stats = await engine.request_json(
        "GET", f"containers/{container_id}/stats", params={"stream": "false", "one-shot": "true"}
    )
    return int(stats["pids_stats"].get("current", 0))


async def test_fork_bomb_is_contained_by_the_pids_limit(
    engine: DockerEngine, base_image: str, make_shell: ShellFactory
) -> None:
    shell = await make_shell(image=base_image, pids_limit=PIDS_LIMIT)
    peaks: list[int] = []
    host_spawns: list[int] = []

    async def watch() -> None:
        while True:
            peaks.append(await _container_pids(engine, shell.container.id))
            if peaks[-1] >= PIDS_LIMIT - 8:  # the bomb is at the limit: can the host still fork?
                host_spawns.append(subprocess.run(["true"], check=False).returncode)
            await asyncio.sleep(0.2)

    async with asyncio.timeout(60), asyncio.TaskGroup() as tg:
        watcher = tg.create_task(watch())
        result = await shell.run("bomb() { bomb | bomb; }; bomb", timeout=4)
        watcher.cancel()
    assert result.timed_out
    assert "Resource temporarily unavailable" in result.output
    # Forks stop at the limit; only docker execs (our interrupt) may join beyond it.
    assert PIDS_LIMIT - 8 <= max(peaks) <= PIDS_LIMIT + 8
    assert host_spawns and set(host_spawns) == {0}  # the host kept forking meanwhile
    assert (await shell.run("echo alive")).output == "alive\n"
    assert await _container_pids(engine, shell.container.id) <= 4  # init, keepalive, shell


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
