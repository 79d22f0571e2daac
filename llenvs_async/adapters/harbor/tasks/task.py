"""Harbor task directories parsed into frozen, typed configuration.

A task directory holds ``task.toml``, ``instruction.md``, ``environment/Dockerfile``
(or a prebuilt ``[environment].docker_image``), ``tests/test.sh`` and optionally
``solution/solve.sh``. Multi-step tasks (``[[steps]]``) keep each step's instruction,
tests, solution and ``workdir/`` under ``steps/<name>/``; a separate verifier
(``[verifier].environment_mode = "separate"`` or a ``[verifier.environment]`` table)
is built from ``tests/`` (``tests/Dockerfile``); ``environment/docker-compose.yaml`` is
parsed by ``compose.py`` (its sidecars run pod-style, see ``sidecars.py``). Anything
malformed raises ``TaskLoadError`` naming the file, the field and the bad value; so does
a format feature we do not run (a separate verifier inside a multi-step task): a clear
refusal rather than a silently different episode.
"""

from __future__ import annotations

import base64
import gzip
import io
import logging
import os
import re
import shlex
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ....errors import EnvError, TaskLoadError
from .compose import ComposeSpec, load_compose
from .config import StepConfig, TaskConfig
from .task_toml import parse_task_config

__all__ = ["HarborTask", "TaskStep", "load_task", "resolve_env", "short_name"]

_ENV_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_WORKDIR_RE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
_MAX_SOLUTION_B64 = 4 << 20
SOLUTION_DIR = "/solution"
_log = logging.getLogger("llenvs_async.harbor")
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def short_name(name: str) -> str:
    """The part of a task name after its ``org/`` prefix (Harbor compares names on it)."""
    return name.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStep:
    """One step of a multi-step task: its configuration and ``steps/<name>/`` directory."""

    config: StepConfig
    path: Path
    instruction: str

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def tests_dir(self) -> Path | None:
        found = self.path / "tests"
        return found if found.is_dir() else None

    @property
    def solution_dir(self) -> Path | None:
        found = self.path / "solution"
        return found if (found / "solve.sh").is_file() else None

    @property
    def workdir_dir(self) -> Path | None:
        found = self.path / "workdir"
        return found if found.is_dir() else None


def resolve_env(env: Mapping[str, str], task_name: str) -> dict[str, str]:
    """Expand ``${VAR}`` / ``${VAR:-default}`` in task env values from the host environment."""

    def expand(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        value = os.environ.get(name, default)
        if value is None:
            raise EnvError(
                f"task {task_name!r} needs host environment variable {name} "
                "(set it, or give a default as ${VAR:-default} in task.toml)"
            )
        return value

    return {key: _ENV_VAR_RE.sub(expand, value) for key, value in env.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class HarborTask:
    """One loaded task: its directory, name, configuration and instruction."""

    path: Path
    name: str
    config: TaskConfig
    instruction: str
    dockerfile: Path | None
    tests_dir: Path
    solution_dir: Path | None
    steps: tuple[TaskStep, ...] = ()
    """A multi-step task's steps, in order (empty for an ordinary task)."""
    compose: ComposeSpec | None = None
    """``environment/docker-compose.yaml``: the main service's settings and its sidecars."""

    @property
    def short_name(self) -> str:
        return short_name(self.name)

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def declared_workdir(self) -> str:
        """``[environment].workdir``, else the Dockerfile's last absolute ``WORKDIR``, else ``/``
        (what a policy can know before a container exists)."""
        if self.config.environment.workdir:
            return self.config.environment.workdir
        if self.dockerfile is not None:
            found = _WORKDIR_RE.findall(_read(self.dockerfile))
            if found and found[-1].startswith("/"):
                return str(found[-1])
        return "/"

    def oracle_command(self, solution_dir: Path | None = None) -> str:
        """Harbor's oracle as ONE shell action: unpack ``solution/`` (or ``solution_dir``, a
        step's) to ``/solution`` and run ``bash /solution/solve.sh`` once, with
        ``[solution].env``, from the working directory.

        The files travel inside the command (a base64 tar), so the action is self-contained:
        nothing is uploaded behind an agent's back, and a replay of it restores the same state.
        """
        solution_dir = solution_dir or self._solve_sh().parent
        payload = base64.b64encode(_solution_tar(solution_dir)).decode("ascii")
        if len(payload) > _MAX_SOLUTION_B64:
            raise TaskLoadError(
                f"is too large for the oracle ({len(payload)} base64 bytes, at most "
                f"{_MAX_SOLUTION_B64})",
                path=str(solution_dir),
                field="solution",
            )
        env = resolve_env(self.config.solution.env, self.name)
        assign = "".join(f"{shlex.quote(f'{k}={v}')} " for k, v in sorted(env.items()))
        return (
            f"rm -rf {SOLUTION_DIR} && printf '%s' '{payload}' | base64 -d | tar -xzf - -C / "
            f"&& env {assign}bash {SOLUTION_DIR}/solve.sh"
        )

    def solution_commands(self) -> tuple[str, ...]:
        """``solution/solve.sh`` split into one command per non-blank, non-comment line: the
        example tasks' convention, for multi-step trajectories (restore, Q-value demos). Real
        scripts (heredocs, multi-line strings, ``set -e``, helper files) need ``oracle_command``.
        """
        text = _read(self._solve_sh())
        return tuple(
            line.strip()
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        )

    def _solve_sh(self) -> Path:
        if self.solution_dir is None or not (self.solution_dir / "solve.sh").is_file():
            raise TaskLoadError(
                "task has no solution/solve.sh", path=str(self.path), field="solution"
            )
        return self.solution_dir / "solve.sh"


def _solution_tar(solution_dir: Path) -> bytes:
    """``solution/`` as a gzipped tar rooted at ``solution/`` (root-owned, no mtimes, not
    even the gzip header's: the same files give the same command in every process, so an
    oracle recognises its earlier actions in a saved trajectory)."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(solution_dir, arcname=SOLUTION_DIR.lstrip("/"), filter=normalise)
    return gzip.compress(buf.getvalue(), compresslevel=9, mtime=0)


def load_task(path: Path | str, *, fallback_name: str | None = None) -> HarborTask:
    """Load and validate a task directory; its name is ``[task].name``, else
    ``fallback_name`` (the registry's name), else the directory name."""
    root = Path(path)
    if not root.is_dir():
        raise TaskLoadError("is not a task directory", path=str(root))
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise TaskLoadError("is missing (every Harbor task has one)", path=str(toml_path))
    config = parse_task_config(_read(toml_path), path=str(toml_path))
    for key in config.ignored:
        _log.warning("%s: %r is not supported by llenvs-async and is ignored", toml_path, key)
    steps = _load_steps(root, config, str(toml_path))
    instruction_path = root / "instruction.md"
    if steps and not instruction_path.is_file():
        instruction = steps[0].instruction  # never shown: each step has its own
    elif not instruction_path.is_file():
        raise TaskLoadError("is missing", path=str(instruction_path))
    else:
        instruction = _read(instruction_path).strip()
    if not instruction:
        raise TaskLoadError("is empty", path=str(instruction_path))
    dockerfile = root / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        if config.environment.docker_image is None:
            raise TaskLoadError(
                "is missing and task.toml names no prebuilt image",
                path=str(dockerfile),
                field="environment.docker_image",
            )
        dockerfile_or_none: Path | None = None
    else:
        dockerfile_or_none = dockerfile
    tests_dir = root / "tests"
    _check_verifier_files(root, config, steps)
    solution_dir = root / "solution"
    compose_files = [root / "environment" / n for n in COMPOSE_FILES]
    compose_path = next((p for p in compose_files if p.is_file()), None)
    compose = load_compose(compose_path) if compose_path is not None else None
    _check_services(config, compose, str(toml_path))
    name = config.task.name if config.task is not None else (fallback_name or root.name)
    return HarborTask(
        path=root,
        name=name,
        config=config,
        instruction=instruction,
        dockerfile=dockerfile_or_none,
        tests_dir=tests_dir,
        solution_dir=solution_dir if solution_dir.is_dir() else None,
        steps=steps,
        compose=compose,
    )


def _check_services(config: TaskConfig, compose: ComposeSpec | None, toml_path: str) -> None:
    """Every collect hook's and artifact's ``service`` is one the task has (``main``, or a
    service of its compose file)."""
    services = compose.service_names if compose is not None else ("main",)
    named: list[tuple[str, str | None]] = [
        (f"verifier.collect[{i}].service", hook.service)
        for i, hook in enumerate(config.verifier.collect)
    ]
    named += [(f"artifacts[{i}].service", a.service) for i, a in enumerate(config.artifacts)]
    for where, service in named:
        if service is not None and service not in services:
            raise TaskLoadError(
                f"names service {service!r}, which the task does not have "
                f"(services: {', '.join(services)}; sidecars come from "
                "environment/docker-compose.yaml)",
                path=toml_path,
                field=where,
                value=service,
            )


def _load_steps(root: Path, config: TaskConfig, toml_path: str) -> tuple[TaskStep, ...]:
    """Each ``[[steps]]`` table with its ``steps/<name>/instruction.md``."""
    if not config.step_configs:
        if (root / "steps").is_dir():
            raise TaskLoadError(
                "has a steps/ directory but task.toml declares no [[steps]]",
                path=toml_path,
                field="steps",
            )
        return ()
    if config.verifier.separate:
        raise TaskLoadError(
            "combines [[steps]] with a separate verifier environment, which llenvs-async does "
            "not run (every step's tests run in the one shared environment)",
            path=toml_path,
            field="verifier.environment_mode",
            value="separate",
        )
    steps = []
    for index, step in enumerate(config.step_configs):
        instruction_path = root / "steps" / step.name / "instruction.md"
        if not instruction_path.is_file():
            raise TaskLoadError(
                f"is missing (the instruction of step {index} {step.name!r})",
                path=str(instruction_path),
                field=f"steps[{index}].name",
                value=step.name,
            )
        instruction = _read(instruction_path).strip()
        if not instruction:
            raise TaskLoadError("is empty", path=str(instruction_path))
        steps.append(TaskStep(config=step, path=instruction_path.parent, instruction=instruction))
    return tuple(steps)


def _check_verifier_files(root: Path, config: TaskConfig, steps: tuple[TaskStep, ...]) -> None:
    """A test.sh for every verification: ``tests/test.sh`` (a step's own overrides it); a
    separate verifier's image holds it, so it needs ``tests/Dockerfile`` or a prebuilt image."""
    tests = root / "tests"
    if config.verifier.separate:
        env = config.verifier.environment
        if not (tests / "Dockerfile").is_file() and (env is None or env.docker_image is None):
            raise TaskLoadError(
                "is missing: a separate verifier is built from tests/Dockerfile (or "
                "[verifier.environment].docker_image names a prebuilt image)",
                path=str(tests / "Dockerfile"),
                field="verifier.environment_mode",
                value="separate",
            )
        return
    if steps:
        for step in steps:
            own = step.tests_dir is not None and (step.tests_dir / "test.sh").is_file()
            if not own and not (tests / "test.sh").is_file():
                raise TaskLoadError(
                    f"is missing (the verifier of step {step.name!r}; tests/test.sh would do)",
                    path=str(step.path / "tests" / "test.sh"),
                )
        return
    if not (tests / "test.sh").is_file():
        raise TaskLoadError("is missing (the verifier)", path=str(tests / "test.sh"))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskLoadError(f"is not UTF-8 text: {exc}", path=str(path)) from exc
    except OSError as exc:
        raise TaskLoadError(f"cannot be read: {exc}", path=str(path)) from exc
