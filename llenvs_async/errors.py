"""The error tree: one root, `LlenvsError`, and structured subclasses.

Foreign errors (aiodocker, httpx, vLLM) are translated at the edge with
``raise ... from exc`` so callers only ever catch our types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import ErrorInfo, Trajectory

__all__ = [
    "BackendError",
    "BackendTimeoutError",
    "ClosedError",
    "ContainerError",
    "ContextLengthError",
    "ContinuationPromptError",
    "DockerUnavailableError",
    "EnvError",
    "EstimationError",
    "GvisorUnavailableError",
    "ImageError",
    "LlenvsError",
    "MissingExtraError",
    "RestoreError",
    "RolloutsFailedError",
    "StaleStateError",
    "StepTimeoutError",
    "TaskLoadError",
    "VerifierError",
]


class LlenvsError(Exception):
    """Root of every error this package raises on purpose."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def __str__(self) -> str:
        return self.message


class ClosedError(LlenvsError):
    """A resource (environment, backend, container, ...) was used after ``aclose()``."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is closed", what=what)
        self.what = what


class EnvError(LlenvsError):
    """An environment could not reset or step."""


class StaleStateError(EnvError):
    """A non-pure environment was asked to step from a state that is not its current one."""

    def __init__(self, message: str, *, expected: Any = None, got: Any = None) -> None:
        super().__init__(message, expected=expected, got=got)
        self.expected = expected
        self.got = got


class StepTimeoutError(EnvError):
    """An environment step ran past the runner's ``step_timeout``."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"environment step exceeded step_timeout={timeout}s", timeout=timeout)
        self.timeout = timeout


class RestoreError(EnvError):
    """An environment could not be restored to a saved state."""


class ContinuationPromptError(RestoreError):
    """A replayed command left the shell waiting at a continuation prompt (PS2)."""

    def __init__(self, message: str, *, command: str = "", step: int | None = None) -> None:
        super().__init__(message, command=command, step=step)
        self.command = command
        self.step = step


class TaskLoadError(EnvError):
    """A task or dataset is malformed or missing; names the file, the field and the value."""

    def __init__(
        self, message: str, *, path: str | None = None, field: str | None = None, value: Any = None
    ) -> None:
        where = " ".join(
            part
            for part in (
                f"{path}:" if path else "",
                f"field {field!r}" if field else "",
                f"(value {value!r})" if value is not None else "",
            )
            if part
        )
        super().__init__(f"{where} {message}".strip(), path=path, field=field, value=value)
        self.path = path
        self.field = field
        self.value = value


class VerifierError(EnvError):
    """The verifier ran but its reward could not be read (``kind`` says why)."""

    def __init__(self, message: str, *, kind: str, path: str | None = None) -> None:
        super().__init__(message, kind=kind, path=path)
        self.kind = kind
        self.path = path


class BackendError(LlenvsError):
    """An LLM backend failed: bad request, server error after retries, malformed reply."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        url: str | None = None,
        body: str | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, url=url, body=body)
        self.status_code = status_code
        self.url = url
        self.body = body


class BackendTimeoutError(BackendError):
    """A backend request timed out (after retries)."""


class ContextLengthError(BackendError):
    """A request's prompt (plus ``max_tokens``) does not fit the model's context window.

    Returned per request (in a ``GenerationError``): the rollout stops with
    ``stop_reason="context_length"``, which is an episode outcome, not a framework error.
    """


class ContainerError(LlenvsError):
    """A Docker operation failed (create, start, exec, commit, remove, ...)."""

    def __init__(
        self, message: str, *, container_id: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message, container_id=container_id, status=status)
        self.container_id = container_id
        self.status = status


class DockerUnavailableError(ContainerError):
    """No Docker engine answers at the configured socket / ``DOCKER_HOST``."""


class GvisorUnavailableError(ContainerError):
    """gVisor cannot run here: ``runsc`` (or root, or what it needs) is missing; says which."""


class MissingExtraError(LlenvsError, ImportError):
    """An optional dependency is missing or does not import; ``extra`` names what installs it
    (``pip install 'llenvs-async[<extra>]'``). The one error for every extra."""

    def __init__(
        self, what: str, *, extra: str, package: str, note: str = "", cause: str = ""
    ) -> None:
        message = f"{what} needs {package}{note}: pip install 'llenvs-async[{extra}]'"
        super().__init__(message + (f" ({cause})" if cause else ""), extra=extra, package=package)
        self.extra, self.package = extra, package


class ImageError(ContainerError):
    """An image is missing or could not be built/imported."""


class EstimationError(LlenvsError):
    """A Monte Carlo estimate cannot be made honestly (unknown or violated reward range)."""


class RolloutsFailedError(EstimationError):
    """``failures="raise"`` and rollouts failed: how many, the first error, and every
    trajectory of the run (nothing finished is lost).
    """

    def __init__(
        self,
        message: str,
        *,
        failed: int,
        total: int,
        first_error: ErrorInfo,
        trajectories: Sequence[Trajectory] = (),
    ) -> None:
        super().__init__(message, failed=failed, total=total, first_error=first_error)
        self.failed = failed
        self.total = total
        self.first_error = first_error
        self.trajectories = tuple(trajectories)
