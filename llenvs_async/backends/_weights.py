"""Policy versions and weight updates, shared by every backend.

A backend's ``policy_version`` is an int its trainer chooses (``update_weights(...,
version=step)``). vLLM labels weights with strings: this backend writes ``str(version)``,
so a label that is a decimal int is that version; any other label (vLLM's ``"default"``,
set before the first update) is the backend's initial version.

The route for moving tensors into an engine (CPU and GPU alike) is a file handoff: the tensors are
written as one safetensors file into a fresh directory (under ``/dev/shm`` when it
exists, so it is a memory copy) and the engine's stock ``reload_weights(weights_path=dir)``
worker method loads them through the model's own ``load_weights``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, get_args

from .._shield import shielded
from ..errors import BackendError
from ..types import Completion, GenerationError

__all__ = [
    "DEFAULT_UPDATE_TIMEOUT",
    "SwapTarget",
    "UpdateMode",
    "WeightSwitch",
    "check_update",
    "check_version",
    "engine_spans",
    "swap_weights",
    "tag",
    "weights_file",
]

UpdateMode = Literal["keep", "wait", "abort"]
WEIGHTS_FILE = "model.safetensors"
DEFAULT_UPDATE_TIMEOUT = 600.0  # seconds; mode="wait" waits for requests in flight to finish


def check_update(mode: object, version: object, *, owner: str) -> None:
    """Refuse a bad ``mode`` or ``version`` before anything is paused."""
    if mode not in get_args(UpdateMode):
        raise ValueError(
            f"{owner}.update_weights mode must be one of 'keep', 'wait', 'abort', got {mode!r}"
        )
    if not isinstance(version, int) or isinstance(version, bool):
        raise TypeError(
            f"{owner}.update_weights version must be an int, "
            f"got {type(version).__name__} {version!r}"
        )


def check_version(version: object, *, owner: str) -> None:
    """A constructor's ``policy_version=``: an int or None."""
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise TypeError(
            f"{owner}(policy_version=...) must be an int or None, got {type(version).__name__} "
            f"{version!r}"
        )


Outcome = TypeVar("Outcome", Completion, GenerationError, Completion | GenerationError)


def tag(outcome: Outcome, version: int | None) -> Outcome:
    """``outcome`` with ``policy_version=version`` unless it already carries one."""
    if isinstance(outcome, Completion) and outcome.policy_version is None and version is not None:
        return dataclasses.replace(outcome, policy_version=version)
    return outcome


def engine_spans(
    spans: Sequence[Any] | None, initial: int | None
) -> tuple[tuple[int, int, int], ...]:
    """vLLM's ``WeightVersionSpan(version: str, start, end)`` list as ``(version, start, end)``."""
    out: list[tuple[int, int, int]] = []
    for span in spans or ():
        label = str(span.version)
        version = int(label) if label.lstrip("-").isdigit() else initial
        if version is None:
            return ()
        out.append((version, int(span.start), int(span.end)))
    return tuple(out)


class SwapTarget(Protocol):
    """The five steps of a weight swap on one engine (in-process ``AsyncLLM`` or HTTP server)."""

    async def pause(self, mode: UpdateMode) -> None: ...
    async def reload(self, directory: str) -> None: ...
    async def reset_cache(self) -> None: ...
    async def label(self, version: str) -> None: ...
    async def resume(self) -> None: ...


async def swap_weights(
    target: SwapTarget, directory: str, version: int, mode: UpdateMode, *, within: float
) -> None:
    """Pause (``mode``), reload from ``directory``, reset the prefix cache (preempting running
    requests), label the weights ``str(version)``, and resume (always).

    The first four steps together, then the resume, are each bounded by ``within``; expiry
    raises ``BackendError`` that says what state the engine is left in. A failed resume is
    attached as a note to the error of the load (which stays the one raised)."""
    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("pause", lambda: target.pause(mode)),
        ("reload_weights", lambda: target.reload(directory)),
        ("reset_prefix_cache", target.reset_cache),
        ("update_weight_version", lambda: target.label(str(version))),
    ]
    what = f"update_weights version {version} (mode={mode!r})"
    stage = steps[0][0]
    try:
        async with asyncio.timeout(within):
            for name, step in steps:
                stage = name
                await step()
    except Exception as exc:
        resumed = await _resume_after(target, within)
        if isinstance(exc, TimeoutError):
            state = (
                "was resumed, but its weights may be partly replaced: load them again"
                if resumed is None
                else f"could not be resumed ({resumed}): it may still be paused"
            )
            raise BackendError(
                f"{what} timed out after {within:g} s in {stage}; the engine {state}"
            ) from exc
        if resumed is not None:
            exc.add_note(f"resuming the engine afterwards failed too: {resumed}")
        raise
    failed = await _resume_after(target, within)
    if failed is not None:
        raise BackendError(f"{what} loaded, but the engine could not be resumed: {failed}")


async def _resume_after(target: SwapTarget, within: float) -> str | None:
    """Resume within ``within`` seconds: ``None`` when it worked, else what went wrong."""
    try:
        async with asyncio.timeout(within):
            await target.resume()
    except TimeoutError:
        return f"resume timed out after {within:g} s"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class WeightSwitch:
    """A backend's version and the bookkeeping of its updates: one at a time, and the
    requests a ``mode="abort"`` update stopped are sent again once it is done."""

    def __init__(
        self,
        version: int | None,
        handoff_dir: str | os.PathLike[str] | None,
        update_timeout: float = DEFAULT_UPDATE_TIMEOUT,
        *,
        owner: str,
    ) -> None:
        if not update_timeout > 0:
            raise ValueError(f"{owner} update_timeout must be > 0, got {update_timeout!r}")
        self.initial = version
        self.version = version
        self.aborts = 0  # how many mode="abort" updates have finished
        self._handoff_dir = handoff_dir
        self._timeout = update_timeout
        self._lock = asyncio.Lock()
        self._resumed = asyncio.Event()  # cleared while a mode="abort" update runs
        self._resumed.set()

    async def switch(
        self,
        named_tensors: Iterable[tuple[str, Any]],
        version: int,
        mode: UpdateMode,
        target: SwapTarget,
    ) -> None:
        """Write the tensors to a handoff directory, then ``swap_weights`` on ``target``;
        once started the (bounded) swap runs to its end even if the caller is cancelled.
        On success ``version`` is current; a failure raises ``BackendError``."""
        async with self._lock, weights_file(named_tensors, self._handoff_dir) as directory:
            await shielded(self._run(target, directory, version, mode), within=None)

    async def _run(
        self, target: SwapTarget, directory: str, version: int, mode: UpdateMode
    ) -> None:
        if mode == "abort":
            self._resumed.clear()
        try:
            await swap_weights(target, directory, version, mode, within=self._timeout)
            self.version = version
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(
                f"could not load weights version {version} (mode={mode!r}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if mode == "abort":
                self.aborts += 1
                self._resumed.set()

    async def complete(
        self, send: Callable[[Sequence[int]], Awaitable[Sequence[Outcome]]], count: int
    ) -> list[Outcome]:
        """``send(positions)`` for positions ``0..count-1``; those an abort-mode update stopped
        (one running now, or finished since they were sent) are sent again, once it is done,
        until none is (the caller never sees an aborted attempt)."""
        outcomes: dict[int, Outcome] = {}
        pending: Sequence[int] = range(count)
        while pending:
            aborts = self.aborts
            sent = await send(pending)
            again: list[int] = []
            for k, outcome in zip(pending, sent, strict=True):
                if await self._stopped(outcome, aborts):
                    again.append(k)
                else:
                    outcomes[k] = outcome
            pending = again
        return [outcomes[k] for k in range(count)]

    async def complete_one(self, send: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """``complete`` for a single request."""

        async def as_list(_: Sequence[int]) -> list[Outcome]:
            return [await send()]

        [outcome] = await self.complete(as_list, 1)
        return outcome

    async def _stopped(self, outcome: Completion | GenerationError, aborts: int) -> bool:
        """Whether ``outcome`` (of a request sent when ``self.aborts`` was ``aborts``) was
        stopped by an abort-mode update; waits for that update to finish."""
        if not (
            isinstance(outcome, Completion)
            and outcome.finish_reason == "abort"
            and (self.aborts != aborts or not self._resumed.is_set())
        ):
            return False
        await self._resumed.wait()
        return True


def default_handoff_dir() -> Path | None:
    """``/dev/shm`` (memory-backed) when it is a writable directory, else the system temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


@contextlib.asynccontextmanager
async def weights_file(
    named_tensors: Iterable[tuple[str, Any]], parent: str | os.PathLike[str] | None
) -> AsyncIterator[str]:
    """A fresh directory holding ``named_tensors`` as ``model.safetensors``; removed on exit.

    The tensors are read on the event loop (the caller's model must not change under us),
    then written off the loop. Tensors that share storage (tied weights) are copied.
    """
    tensors = _cpu_tensors(named_tensors)
    where = parent if parent is not None else default_handoff_dir()
    directory = tempfile.mkdtemp(prefix="llenvs-weights-", dir=where)
    try:
        await asyncio.to_thread(_save, tensors, os.path.join(directory, WEIGHTS_FILE))
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _cpu_tensors(named_tensors: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - vLLM always brings torch
        raise BackendError(f"update_weights needs torch: {exc}") from exc
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for item in named_tensors:
        try:
            name, tensor = item
        except (TypeError, ValueError):
            raise TypeError(
                f"update_weights expects (name, tensor) pairs, got {type(item).__name__}"
            ) from None
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"update_weights expects (str, torch.Tensor) pairs, got "
                f"({type(name).__name__}, {type(tensor).__name__}) for {name!r}"
            )
        if name in out:
            raise ValueError(f"update_weights got the tensor {name!r} twice")
        cpu = tensor.detach().to("cpu").contiguous()
        if cpu.data_ptr() in seen or cpu.data_ptr() == tensor.data_ptr():
            cpu = cpu.clone()  # never alias the caller's live tensor or another entry
        seen.add(cpu.data_ptr())
        out[name] = cpu
    if not out:
        raise ValueError("update_weights got no tensors")
    return out


def _save(tensors: dict[str, Any], path: str) -> None:
    from safetensors.torch import save_file

    save_file(tensors, path)
