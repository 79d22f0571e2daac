"""A Ray cluster of several nodes on this machine, every socket on 127.0.0.1.

For tests, benchmarks and trying things out: each node is a ``ray start`` (head, then
workers) with a custom resource (``docker`` by default), its own free ports and its
own process group, so ``kill_node`` and ``stop`` end exactly the processes this object
started (never ``ray stop``, which would end every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ..errors import LlenvsError
from ._loopback import is_loopback

__all__ = ["LocalRayCluster", "RayStartError"]

_START_TIMEOUT = 120.0
_SS_USERS = re.compile(r"pid=(\d+)")


class RayStartError(LlenvsError):
    """``ray start`` failed for one node of a ``LocalRayCluster``."""


def free_ports(count: int, taken: set[int]) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1, free now and not in ``taken`` (added)."""
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        while len(ports) < count:  # every socket stays bound until all are chosen
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port not in taken:
                ports.append(port)
                taken.add(port)
    return ports


@dataclass(frozen=True, slots=True)
class _Node:
    index: int
    pgid: int
    node_manager_port: int


class LocalRayCluster:
    """``nodes`` Ray nodes on 127.0.0.1, each with ``resources`` and ``num_cpus``.

    A context manager: ``start()`` on enter, ``stop()`` on exit (also on error).
    """

    def __init__(
        self,
        nodes: int = 2,
        *,
        resources: Mapping[str, float] | None = None,
        num_cpus: int = 1,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        self.num_nodes = nodes
        self.resources = dict(resources if resources is not None else {"docker": 4})
        self.num_cpus = num_cpus
        self.env = dict(env or {})
        self.port = 0
        self._ports: set[int] = set()
        self._nodes: list[_Node] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def address(self) -> str:
        """The GCS address drivers pass to ``ray.init`` (``127.0.0.1:PORT``)."""
        if not self.port:
            raise RuntimeError("LocalRayCluster is not started")
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        """Start the head and the workers; returns the address. Stops what started on failure."""
        self._tmp = tempfile.TemporaryDirectory(prefix="llenvs-ray-", dir="/tmp")
        (self.port,) = free_ports(1, self._ports)
        try:
            for index in range(self.num_nodes):
                self._start_node(index)
        except BaseException:
            self.stop()
            raise
        return self.address

    def _start_node(self, index: int) -> None:
        assert self._tmp is not None
        free = iter(free_ports(11, self._ports))
        flags = (
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        )
        ports = {flag: next(free) for flag in flags}
        args = [
            "start",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            f"--resources={json.dumps(self.resources)}",
            "--disable-usage-stats",
            *(f"{flag}={port}" for flag, port in ports.items()),
        ]
        if index == 0:
            args += [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--dashboard-port={next(free)}",
                f"--ray-client-server-port={next(free)}",
                f"--temp-dir={self._tmp.name}",
            ]
        else:
            args.append(f"--address={self.address}")
        env = {
            **os.environ,
            **self.env,
            # Fixed defaults (44217, 44227) would collide with any other Ray on the machine.
            "AUTOSCALER_METRIC_PORT": str(next(free)),
            "DASHBOARD_METRIC_PORT": str(next(free)),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        log = Path(self._tmp.name) / f"start-{index}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "llenvs_async.distributed._loopback", *args],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
            # Registered before waiting: a start that hangs is still stopped.
            self._nodes.append(
                _Node(index=index, pgid=proc.pid, node_manager_port=ports["--node-manager-port"])
            )
            try:
                code = proc.wait(timeout=_START_TIMEOUT)
            except subprocess.TimeoutExpired:
                code = None
        if code != 0:
            raise RayStartError(
                f"ray start of node {index} failed (exit {code}): {log.read_text()[-2000:]}",
                node=index,
                exit_code=code,
            )

    def add_node(self) -> int:
        """Start one more worker node; returns its index."""
        index = max(n.index for n in self._nodes) + 1
        self.num_nodes += 1
        self._start_node(index)
        return index

    def node_manager_port(self, node: int) -> int:
        """The raylet port of node ``node`` (``NodeManagerPort`` in ``ray.nodes()``)."""
        (target,) = (n for n in self._nodes if n.index == node)
        return target.node_manager_port

    def pids(self, node: int | None = None) -> set[int]:
        """The live (not zombie) processes of every node, or of node ``node``: its process
        group and their descendants (Ray puts each worker in a process group of its own)."""
        return _members({n.pgid for n in self._nodes if node is None or n.index == node})

    def kill_node(self, node: int) -> None:
        """SIGKILL every process of worker node ``node`` (a node dying, not a clean stop)."""
        if node == 0:
            raise ValueError("kill_node kills a worker node; node 0 is the head")
        (target,) = (n for n in self._nodes if n.index == node)
        _kill_all(_members({target.pgid}), signal.SIGKILL)

    def remote_connections(self, also: Collection[int] = ()) -> list[str]:
        """``ss`` lines of TCP connections of this cluster's processes (and of ``also``, e.g.
        the driver) whose peer is not loopback (expected: none)."""
        pids = self.pids() | set(also)
        out = subprocess.run(
            ["ss", "-tnpH"], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        bad = []
        for line in out.splitlines():
            fields = line.split()
            if len(fields) < 5 or not pids & {int(p) for p in _SS_USERS.findall(line)}:
                continue
            peer = fields[4].rpartition(":")[0].removeprefix("[::ffff:").strip("[]")
            if not is_loopback(peer):
                bad.append(line)
        return bad

    def stop(self, grace: float = 3.0) -> None:
        """End every process this cluster started: SIGTERM, ``grace`` seconds, then SIGKILL
        (raylet and GCS can wait on each other when stopped together); idempotent."""
        groups = {n.pgid for n in self._nodes}  # kept: ``pids()`` still finds stragglers
        pids = _members(groups)  # before the raylets go: their workers are re-parented then
        _kill_all(pids, signal.SIGTERM)
        _wait_gone(pids, grace)
        _kill_all(_members(groups) | pids, signal.SIGKILL)
        _wait_gone(pids, 10.0)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalRayCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _kill_all(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_gone(pids: set[int], limit: float) -> None:
    deadline = time.monotonic() + limit
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def _stat(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (not zombies)."""
    return {p for p in pids if (st := _stat(str(p))) is not None and st[0] != "Z"}


def _members(groups: set[int]) -> set[int]:
    """Live processes whose process group is in ``groups``, and all their descendants."""
    parent: dict[int, int] = {}
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        st = _stat(entry.name)
        if st is None or len(st) < 3 or st[0] == "Z":
            continue
        pid = int(entry.name)
        parent[pid] = int(st[1])
        if int(st[2]) in groups:
            found.add(pid)
    grew = True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in found and pid not in found}
        found |= more
        grew = bool(more)
    return found
