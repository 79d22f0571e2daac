"""A real Ray cluster of two nodes on 127.0.0.1 for the whole session.

Started with the ``ray start`` CLI (``LocalRayCluster``: head + worker, free ports, a
``docker`` resource, own process groups) and stopped in ``finally`` by killing exactly
its processes. Without Ray: skipped locally, FAILED in CI (``CI=true``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER_PER_NODE = 4


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


def require_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"Ray is not installed ({exc}): pip install -e '.[ray]'")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A started two-node ``LocalRayCluster``, this process connected to it as the driver."""
    require_ray()
    from llenvs_async.distributed import LocalRayCluster, connect

    cluster = LocalRayCluster(
        2,
        resources={"docker": DOCKER_PER_NODE},
        env={
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        },
    )
    try:
        cluster.start()
        with connect(cluster.address):
            yield cluster
            # Every connection of the cluster and of this driver stayed on 127.0.0.1.
            assert cluster.remote_connections(also={os.getpid()}) == []
    finally:
        cluster.stop()
    assert cluster.pids() == set()


def node_ids(cluster: Any) -> dict[int, str]:
    """Node index -> Ray node id, for the nodes alive now."""
    import ray

    by_port = {n["NodeManagerPort"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    out = {}
    for index in range(cluster.num_nodes):
        try:
            port = cluster.node_manager_port(index)
        except ValueError:
            continue
        if port in by_port:
            out[index] = by_port[port]
    return out


def live_actors() -> list[str]:
    """Names of the live environment actors in the cluster."""
    import ray

    from llenvs_async.distributed.ray import ACTOR_PREFIX

    return sorted(
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == ACTOR_PREFIX
    )  # fmt: skip


@pytest.fixture
async def docker_engine() -> AsyncIterator[Any]:
    """A connected engine with the Debian base image the example tasks build FROM
    (``base_image_engine``)."""
    from tests._support import base_image_engine

    async with base_image_engine() as engine:
        yield engine


async def containers_of(engine: Any, host: str, pids: set[int]) -> list[str]:
    """Ids of the containers created by processes ``pids`` on ``host`` (actor workers)."""
    from llenvs_async._ownership import OWNER_LABEL

    found = []
    for pid in sorted(pids):
        found += [
            str(c["Id"]) for c in await engine.list_containers({OWNER_LABEL: f"{host}:{pid}"})
        ]
    return found
