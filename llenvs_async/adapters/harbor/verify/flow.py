"""Verifying an episode: the ``[[verifier.collect]]`` hooks, the verifier, then the artifacts.

Shared mode runs ``test.sh`` in the agent's container (artifacts collected after it, as
Harbor does, when they are kept); separate mode collects the artifacts first and hands
them to a container of the verifier's own (``verification.py``). Artifacts are saved
under the runtime's ``artifacts_dir`` as ``<task>/<episode>/...``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ....docker.container import Container
from ....docker.engine import DockerEngine
from ....docker.runtime import RuntimeHost
from ....errors import ContainerError, LlenvsError, VerifierError
from ..episode.instance import DATASET_LABEL, HarborRuntime, Instance, as_docker, daemon_has_bridge
from ..images.provision import offline_test_sh
from ..tasks.config import VerifierConfig
from ..tasks.task import HarborTask
from .artifacts import Collected, collect_artifacts, run_collect_hooks, save_artifacts, transfer_tar
from .network import check_offline_verifier
from .verification import run_separate, run_tests, verifier_environment
from .verifier import VerifierResult

__all__ = ["verify_instance"]

_VERIFIER_TAIL_CHARS = 4000


async def _process_limit_reached(container: RuntimeHost) -> str | None:
    """Why the verifier could not run, when the agent's processes fill the container's
    process limit (a fork bomb): the episode then scores 0, it is no infrastructure error.
    ``None`` when the limit is not reached (or, in a gVisor sandbox, not measured)."""
    if "pids" not in container.capabilities:
        return None
    try:
        current, limit = await container.pids()
    except LlenvsError:
        return None
    if limit is None or current < limit - max(2, limit // 50):  # the bomb's own churn
        return None
    return (
        f"the verifier could not run: the agent's processes fill the container's process "
        f"limit ({current} of {limit})"
    )


async def verify_instance(
    instance: Instance,
    task: HarborTask,
    *,
    runtime: HarborRuntime,
    engine: Callable[[], Awaitable[DockerEngine]],
    cfg: VerifierConfig,
    tests: list[Path],
    episode_dir: str,
    dataset_spec: str,
    track: Callable[[Container | None], None],
) -> VerifierResult:
    """Verify ``instance`` (``cfg``: the step's or task's verifier; ``tests``: the folders
    uploaded to ``/tests``); the result carries a log tail and what was collected."""
    container = instance.container
    provisioned = runtime.images.build.provision_verifier
    bridge = instance.bridge  # known when the instance has a network; else asked if it matters
    if not instance.network and verifier_environment(task).wants_network:
        bridge = await daemon_has_bridge(await engine())  # is --allow-network worth naming?

    def explain(log: str, network: bool) -> None:
        check_offline_verifier(task, log, network=network, bridge=bridge, provisioned=provisioned)

    sidecars = instance.sidecars.containers if instance.sidecars is not None else {}
    hooks = await run_collect_hooks(
        {"main": container, **sidecars}, task.config.verifier.collect, task_name=task.name
    )

    async def collect() -> list[Collected]:
        services = {"main": as_docker(container), **sidecars}
        return await collect_artifacts(services, task.config.artifacts, task_name=task.name)

    collected = []
    if cfg.separate:
        collected = await collect()
        result, log = await run_separate(
            await engine(),
            runtime.images,
            task,
            artifacts=transfer_tar(collected),
            allow_network=runtime.allow_network,
            labels={DATASET_LABEL: dataset_spec},
            explain=explain,
            track=track,
        )
    else:
        offline = None
        if runtime.images.provisioned(task):  # not a prebuilt image, even with a Dockerfile
            offline = offline_test_sh(
                (task.tests_dir / "test.sh").read_text(encoding="utf-8"),
                index_url=runtime.images.build.provision_index_url,
            )
        try:
            result, log = await run_tests(
                container,
                task=task,
                timeout_sec=cfg.timeout_sec,
                env=cfg.env,
                workdir=instance.workdir,
                user=cfg.user,
                tests=tests,
                explain=lambda log: explain(log, instance.network),
                offline=offline,
            )
        except (VerifierError, ContainerError):
            if (full := await _process_limit_reached(container)) is None:
                raise
            result = VerifierResult(reward=0.0, rewards={"reward": 0.0}, source="process-limit")
            log = full
        if runtime.artifacts_dir is not None:  # Harbor collects after verification
            collected = await collect()
    extra: dict[str, Any] = {}
    if hooks:
        extra["collect_hooks"] = hooks
    if collected:
        extra["artifacts"] = [item.manifest() for item in collected]
    if runtime.artifacts_dir is not None and collected:
        where = runtime.artifacts_dir / task.short_name / episode_dir
        await save_artifacts(collected, where)
        extra["artifacts_dir"] = str(where)
    output = log[-_VERIFIER_TAIL_CHARS:]
    gap = runtime.images.python_gap(task)
    if gap is not None and result.reward < 1.0:  # a failure the Python may explain
        extra["python_gap"] = gap
        output = f"{output.rstrip()}\n[note: {gap}]"
    return replace(result, output=output, extra=extra)
