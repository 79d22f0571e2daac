"""Running a Harbor verifier: in the agent's container (shared) or in its own (separate).

Shared: ``tests/`` (then a step's own ``tests/``, overriding same-named files) is uploaded
to ``/tests`` and ``test.sh`` runs in its own exec. Separate (``[verifier].environment_mode
= "separate"`` or ``[verifier.environment]``): a fresh container starts from the verifier
image (``tests/Dockerfile``, ``tests/`` as its build context, or a prebuilt
``[verifier.environment].docker_image``; built offline under the same local-image rules as
the task image), which must hold ``/tests/test.sh``; only ``/logs/artifacts`` and the
declared ``artifacts`` cross over, at their original paths. It gets the resources and
network of ``[verifier.environment]`` (else a copy of ``[environment]``), the same security
defaults and labels as the agent's container, and is removed when the verification ends
(also on error or cancellation). Either way the reward is read from ``/logs/verifier``.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from ....docker.container import Container, ContainerSpec
from ....docker.engine import DockerEngine
from ....docker.runtime import RuntimeHost
from ....errors import ContainerError, VerifierError
from ..images.image import TASK_IMAGE_LABEL, TaskImages
from ..tasks.config import EnvironmentConfig
from ..tasks.task import HarborTask, resolve_env
from .verifier import REWARD_JSON, REWARD_TXT, VERIFIER_LOG_DIR, VerifierResult, parse_reward

__all__ = [
    "ROLE_LABEL",
    "read_text",
    "run_separate",
    "run_tests",
    "pack_tests",
    "verifier_environment",
]

ROLE_LABEL = "llenvs.harbor.role"
_MIB = 1 << 20
_NO_TEST_SH = 3


async def read_text(container: RuntimeHost, path: str) -> str | None:
    """A file's text, or ``None`` when it does not exist."""
    try:
        data = await container.get_file(path)
    except ContainerError as exc:
        if exc.status == 404:
            return None
        raise
    return data.decode("utf-8", "replace")


def pack_tests(dirs: Sequence[Path], test_sh: str | None = None) -> bytes:
    """The ``tests/`` directories, later ones overriding same-named files, as one tar rooted
    at ``tests/`` (owned by root); ``test_sh`` replaces ``tests/test.sh``'s content."""

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return None if test_sh is not None and info.name == "tests/test.sh" else info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for directory in dirs:
            tar.add(directory, arcname="tests", filter=as_root)
        if test_sh is not None:
            data = test_sh.encode("utf-8")
            info = tarfile.TarInfo("tests/test.sh")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def _prepare(container: RuntimeHost, script: str) -> int | None:
    run = await container.exec(["/bin/sh", "-c", script], timeout=60, user="0")
    if run.exit_code not in (0, _NO_TEST_SH):
        raise VerifierError(
            f"could not prepare /tests and {VERIFIER_LOG_DIR}: {run.output.strip()[:500]}",
            kind="setup",
        )
    return run.exit_code


async def run_tests(
    container: RuntimeHost,
    *,
    task: HarborTask,
    timeout_sec: float,
    env: Mapping[str, str],
    workdir: str,
    user: str | int | None,
    tests: Sequence[Path] | None,
    explain: Callable[[str], None],
    offline: tuple[str, Mapping[str, str]] | None = None,
) -> tuple[VerifierResult, str]:
    """Run ``/tests/test.sh`` (uploading ``tests`` first unless ``None``: the image holds
    them) and parse the reward; returns it with the verifier's log. ``explain(log)`` runs
    when no reward could be read or it is below 1 (it may raise a better error).
    ``offline``: a provisioned verifier's rewritten ``test.sh`` and its extra environment."""
    setup = f"rm -rf {VERIFIER_LOG_DIR} && mkdir -p -m 777 {VERIFIER_LOG_DIR}"
    if tests is not None:
        await _prepare(container, f"rm -rf /tests && {setup}")
        await container.put_archive("/", pack_tests(tests, offline[0] if offline else None))
    elif await _prepare(container, f"{setup} && test -f /tests/test.sh || exit 3") == 3:
        raise VerifierError(
            f"the verifier image of {task.name!r} holds no /tests/test.sh: a separate "
            "verifier's tests/Dockerfile must COPY it there (tests are not uploaded)",
            kind="setup",
            path="/tests/test.sh",
        )
    run = await container.exec(
        ["bash", "-c", f"bash /tests/test.sh > {VERIFIER_LOG_DIR}/test-stdout.txt 2>&1"],
        timeout=timeout_sec,
        env={**resolve_env(env, task.name), **(offline[1] if offline else {})},
        workdir=workdir,
        user=None if user is None else str(user),
    )
    log = await read_text(container, f"{VERIFIER_LOG_DIR}/test-stdout.txt") or ""
    if run.timed_out:
        raise VerifierError(
            f"the verifier of {task.name!r} ran past timeout_sec={timeout_sec:g}s",
            kind="timeout",
            path="/tests/test.sh",
        )
    try:
        result = parse_reward(
            await read_text(container, REWARD_JSON), await read_text(container, REWARD_TXT)
        )
    except VerifierError:
        explain(log)
        raise
    if result.reward < 1.0:
        explain(log)
    return replace(result, exit_code=run.exit_code), log


def verifier_environment(task: HarborTask) -> EnvironmentConfig:
    """Where the verifier runs: ``[environment]`` when shared; when separate,
    ``[verifier.environment]``, else a copy of ``[environment]`` (Harbor's rule)."""
    if not task.config.verifier.separate:
        return task.config.environment
    return task.config.verifier.environment or task.config.environment


async def run_separate(
    engine: DockerEngine,
    images: TaskImages,
    task: HarborTask,
    *,
    artifacts: tuple[bytes, list[str]],
    allow_network: bool,
    labels: Mapping[str, str],
    explain: Callable[[str, bool], None],
    track: Callable[[Container | None], None] = lambda container: None,
) -> tuple[VerifierResult, str]:
    """Verify in a fresh container of the verifier image with the artifacts put in place;
    returns the result and the log (``explain(log, had_network)`` as in ``run_tests``).
    ``track`` is told the verifier container, then ``None`` once it is removed, so the
    instance that owns it can remove it too when it is closed meanwhile."""
    image = await images.ensure_verifier(engine, task)
    venv = verifier_environment(task)
    if venv.gpus:
        raise VerifierError(
            f"the verifier of {task.name!r} needs {venv.gpus} GPU(s); none offered", kind="setup"
        )
    network = allow_network and venv.wants_network
    spec = ContainerSpec(
        image=image,
        env=resolve_env(venv.env, task.name),
        workdir=venv.workdir,
        network_mode="bridge" if network else "none",
        memory_bytes=venv.memory_mb * _MIB,
        cpus=venv.cpus,
        labels={**labels, TASK_IMAGE_LABEL: task.name, ROLE_LABEL: "verifier"},
    )
    tar, parents = artifacts
    cfg = task.config.verifier
    verifier = await Container.create(engine, spec)
    try:
        track(verifier)  # raises when the owner was closed while the container was created
        quoted = " ".join(shlex.quote(p) for p in sorted({"/", *parents}))
        await _prepare(verifier, f"mkdir -p -m 777 /logs/artifacts && mkdir -p {quoted}")
        await verifier.put_archive("/", tar)
        details = await verifier.inspect()
        workdir = venv.workdir or (details.get("Config") or {}).get("WorkingDir") or "/"
        result, log = await run_tests(
            verifier,
            task=task,
            timeout_sec=cfg.timeout_sec,
            env=cfg.env,
            workdir=workdir,
            user=cfg.user,
            tests=None,
            explain=lambda log: explain(log, network),
        )
    finally:
        try:
            await verifier.aclose()
        finally:
            track(None)
    return result, log
