"""A Ray cluster of several nodes on this machine, every socket on 127.0.0.1.

For tests, benchmarks and trying things out: each node is a ``ray start`` (head, then
workers) with a custom resource (``docker`` by default), its own free ports and its
own process group, so ``kill_node`` and ``stop`` end exactly the processes this object
started (never ``ray stop``, which would end every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class _Node:
    index: int
    pgid: int


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
        self.port = free_port()
        try:
            for index in range(self.num_nodes):
                self._start_node(index)
        except BaseException:
            self.stop()
            raise
        return self.address

    def _start_node(self, index: int) -> None:
        assert self._tmp is not None
        ports = {
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--metrics-export-port": free_port(),
        }
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
                f"--dashboard-port={free_port()}",
                f"--ray-client-server-port={free_port()}",
                f"--temp-dir={self._tmp.name}",
            ]
        else:
            args.append(f"--address={self.address}")
        env = {
            **os.environ,
            **self.env,
            # Fixed defaults (44217, 44227) would collide with any other Ray on the machine.
            "AUTOSCALER_METRIC_PORT": str(free_port()),
            "DASHBOARD_METRIC_PORT": str(free_port()),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        log = Path(self._tmp.name) / f"start-{index}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "llenvs_async.distributed._loopback", *args],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
            # Registered before waiting: a start that hangs is still stopped.
            self._nodes.append(_Node(index=index, pgid=proc.pid))
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

    def pids(self, node: int | None = None) -> set[int]:
        """The live processes of every node (or of node ``node``): its process group."""
        groups = {n.pgid for n in self._nodes if node is None or n.index == node}
        found: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) in groups:
                    found.add(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
        return found

    def kill_node(self, node: int) -> None:
        """SIGKILL every process of worker node ``node`` (a node dying, not a clean stop)."""
        if node == 0:
            raise ValueError("kill_node kills a worker node; node 0 is the head")
        (target,) = (n for n in self._nodes if n.index == node)
        _signal_group(target.pgid, signal.SIGKILL)

    def remote_connections(self) -> list[str]:
        """``ss`` lines of TCP connections of this cluster's processes whose peer is not
        loopback (expected: none)."""
        pids = self.pids()
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

    def stop(self, timeout: float = 20.0) -> None:
        """End every process this cluster started (SIGTERM, then SIGKILL); idempotent."""
        nodes, self._nodes = self._nodes, []
        for node in reversed(nodes):
            _signal_group(node.pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        groups = {n.pgid for n in nodes}
        while _alive(groups) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pgid in groups:
            _signal_group(pgid, signal.SIGKILL)
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


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _alive(groups: set[int]) -> bool:
    """Whether any non-zombie process is left in ``groups``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(stat) > 2 and stat[0] != "Z" and int(stat[2]) in groups:
            return True
    return False
