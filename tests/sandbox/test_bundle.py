"""The OCI config a sandbox runs with: safe defaults, limits, owner annotations, users."""

from __future__ import annotations

from pathlib import Path

import pytest

from llenvs_async.docker import ContainerSpec
from llenvs_async.errors import ImageError
from llenvs_async.sandbox.bundle import (
    HOST_TASKS_BASE,
    HOST_TASKS_PER_PID,
    INIT_PATH,
    ImageRootfs,
    oci_config,
)


def rootfs(tmp_path: Path, user: str = "") -> ImageRootfs:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "root:x:0:0::/root:/bin/sh\nagent:x:1000:1001::/h:/bin/sh\n"
    )
    return ImageRootfs(image_id="sha256:x", path=tmp_path, env=("PATH=/img/bin", "A=1"),
                       workdir="/app", user=user)  # fmt: skip


def test_defaults_limits_and_annotations(tmp_path: Path) -> None:
    spec = ContainerSpec(image="img", env={"A": "2"}, pids_limit=10, memory_bytes=1 << 28, cpus=0.5)
    config = oci_config(spec, rootfs(tmp_path), init="/usr/bin/tini", annotations={"o": "me"})
    process = config["process"]
    assert process["args"] == [INIT_PATH, "-s", "--", "sleep", "infinity"]
    assert process["env"] == ["PATH=/img/bin", "A=2"] and process["cwd"] == "/app"
    assert process["noNewPrivileges"] is True and process["user"] == {"uid": 0, "gid": 0}
    caps = set(process["capabilities"]["bounding"])
    assert "CAP_CHOWN" in caps and not caps & {"CAP_NET_RAW", "CAP_MKNOD", "CAP_SYS_ADMIN"}
    resources = config["linux"]["resources"]
    assert resources["pids"] == {"limit": 10 * HOST_TASKS_PER_PID + HOST_TASKS_BASE}
    assert resources["memory"]["limit"] == 1 << 28
    assert resources["cpu"] == {"quota": 50_000, "period": 100_000}
    assert config["annotations"] == {"o": "me"}
    assert {"type": "network"} in config["linux"]["namespaces"]
    init = [m for m in config["mounts"] if m["destination"] == INIT_PATH]
    assert init == [{"destination": INIT_PATH, "type": "bind", "source": "/usr/bin/tini",
                     "options": ["rbind", "ro"]}]  # fmt: skip


def test_users_by_name_or_id(tmp_path: Path) -> None:
    by_name = oci_config(ContainerSpec(image="i", user="agent"), rootfs(tmp_path), init="/t",
                         annotations={})  # fmt: skip
    assert by_name["process"]["user"] == {"uid": 1000, "gid": 1001}
    other = tmp_path / "other"
    other.mkdir()
    by_id = oci_config(ContainerSpec(image="i"), rootfs(other, "7:8"), init="/t", annotations={})
    assert by_id["process"]["user"] == {"uid": 7, "gid": 8}
    third = tmp_path / "third"
    third.mkdir()
    with pytest.raises(ImageError, match="'nobody' is not in the image"):
        oci_config(ContainerSpec(image="i", user="nobody"), rootfs(third), init="/t",
                   annotations={})  # fmt: skip
