"""``ContainerSpec``: how a container is made (image, command, env, limits, capabilities,
labels) as a value, every default the safe one, and its Engine API create body."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._ownership import OWNER_LABELS, SESSION_LABEL

__all__ = ["DEFAULT_CAP_DROP", "ContainerSpec"]

# Capabilities a shell task (apt, pip, compilers, servers on low ports) does not need.
DEFAULT_CAP_DROP = ("AUDIT_WRITE", "MKNOD", "NET_RAW", "SETFCAP", "SETPCAP", "SYS_CHROOT")
_GiB = 1 << 30


def _frozen(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerSpec:
    """How to create a container; every default is the safe one.

    ``command`` runs as the entrypoint and only has to keep the container alive.
    ``network_mode="none"`` disables networking; pass e.g. ``"bridge"`` to allow it.
    """

    image: str
    command: tuple[str, ...] = ("sleep", "infinity")
    env: Mapping[str, str] = field(default_factory=_frozen)
    workdir: str | None = None
    user: str | None = None
    hostname: str | None = None
    name: str | None = None
    network_mode: str = "none"
    memory_bytes: int | None = 2 * _GiB
    pids_limit: int | None = 1024
    cpus: float | None = 1.0
    cap_drop: tuple[str, ...] = DEFAULT_CAP_DROP
    cap_add: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=_frozen)
    extra_hosts: tuple[str, ...] = ()
    """``host:ip`` lines added to ``/etc/hosts`` (containers joining this one share them)."""
    max_file_bytes: int | None = None
    """The largest file a process in it may write (``RLIMIT_FSIZE``; past it the write fails
    with ``File size limit exceeded``): a task's ``storage_mb`` caps any one file at once."""

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("ContainerSpec.image must be a non-empty image name")
        for what, value in (("memory_bytes", self.memory_bytes), ("pids_limit", self.pids_limit),
                            ("max_file_bytes", self.max_file_bytes)):  # fmt: skip
            if value is not None and value <= 0:
                raise ValueError(f"ContainerSpec.{what} must be positive or None, got {value!r}")
        if self.cpus is not None and not (self.cpus > 0 and math.isfinite(self.cpus)):
            raise ValueError(f"ContainerSpec.cpus must be positive or None, got {self.cpus!r}")
        reserved = {*OWNER_LABELS, SESSION_LABEL} & set(self.labels)
        if reserved:
            raise ValueError(f"ContainerSpec.labels may not set {sorted(reserved)}: they are ours")
        for key in ("env", "labels"):
            object.__setattr__(self, key, _frozen(getattr(self, key)))

    def to_config(self, owner_labels: Mapping[str, str]) -> dict[str, Any]:
        """The Engine API ``containers/create`` body."""
        host: dict[str, Any] = {
            "NetworkMode": self.network_mode,
            "Privileged": False,
            "Init": True,
            "CapDrop": list(self.cap_drop),
            "CapAdd": list(self.cap_add),
            "SecurityOpt": ["no-new-privileges:true"],
            "Binds": [],
        }
        if self.extra_hosts:
            host["ExtraHosts"] = list(self.extra_hosts)
        if self.memory_bytes is not None:
            host["Memory"] = host["MemorySwap"] = self.memory_bytes
        if self.pids_limit is not None:
            host["PidsLimit"] = self.pids_limit
        if self.cpus is not None:
            host["NanoCpus"] = int(self.cpus * 1e9)
        if self.max_file_bytes is not None:
            size = self.max_file_bytes
            host["Ulimits"] = [{"Name": "fsize", "Soft": size, "Hard": size}]
        config: dict[str, Any] = {
            "Image": self.image,
            "Entrypoint": list(self.command),
            "Cmd": [],
            "Env": [f"{k}={v}" for k, v in self.env.items()],
            "Labels": {**self.labels, **owner_labels},
            # A disabled network also means an empty /etc/hosts: not when hosts are added
            # (network mode "none" still gives only a loopback interface).
            "NetworkDisabled": self.network_mode == "none" and not self.extra_hosts,
            "HostConfig": host,
            "AttachStdin": False,
            "OpenStdin": False,
            "Tty": False,
        }
        for key, value in (("WorkingDir", self.workdir), ("User", self.user),
                           ("Hostname", self.hostname)):  # fmt: skip
            if value:
                config[key] = value
        return config
