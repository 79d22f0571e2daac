"""Our Harbor tasks served as a verifiers v1 environment, for prime-rl.

``pip install 'llenvs-async[verifiers]'``

::

    from llenvs_async.integrations.verifiers import env_config, serving

    config = env_config("examples/tasks", max_steps=3, action_format="tools")
    async with serving(config, address="tcp://127.0.0.1:5000", max_concurrent=8) as server:
        ...  # prime-rl's orchestrator (verifiers' EnvClient) connects to server.address

The route verifiers 0.4 supports (read in ``verifiers/v1/serve/server.py``, ``env.py`` and
``harness.py``): an env server is verifiers' own ``EnvServer`` over ZMQ + msgpack, and what it
serves is an ``Env`` built from a taskset id and a harness id by its plugin loader. A harness
"may run its loop in-process instead of launching a program, as long as every model call goes
through ``endpoint`` + ``secret``": the interception server then records every turn, and with
prime-rl's ``TrainClientConfig`` (a vLLM server's ``/inference/v1/generate``) its token ids and
logprobs. So we do not speak the wire protocol ourselves (a second server would drift from
theirs); we give verifiers a plugin:

- taskset ``LlenvsTaskset``: the tasks of a local Harbor directory, in the dataset's stable
  order; each task's data carries ``source`` (the directory) and ``task`` (its name), its
  prompt is the task's instruction. It loads on the client side without a container.
- harness ``LlenvsHarness``: plays the task with ``TrajectoryRunner`` in the server process,
  a fresh container of ours per episode (``HarborAdapter``, our limits, ``runc`` or
  ``gvisor``), our agent protocol (``action_format``), the model reached through the
  rollout's interception endpoint with ``OpenAIBackend``. The runner's teardown removes the
  container on success, error and cancellation (a client's ``cancel`` cancels the episode).
- reward: the Harbor verifier's, as our environment returns it (``environment_reward``, the
  trajectory's return); metrics ``llenvs_steps`` and ``llenvs_sampled_tokens``. A failed
  rollout ends its trace with an error (``trace.ok`` false, the episode's ``errors``): data,
  never dropped.
- token ids: every turn's prompt ids, completion ids and completion logprobs, as the engine
  returned them to our backend, in ``trace.info[TURN_TOKENS_KEY]`` (one verifiers
  ``TurnTokens`` per model call, in order; ``turn_tokens(trace)`` reads them back). A
  harness cannot put them on the trace's nodes, where a trainer reads them: verifiers fills
  ``MessageNode.token_ids``/``mask``/``logprobs`` only at the interception's commit, from
  the ``Response.tokens`` that its train client alone produces (a response ``@intercept``
  may only replace the message); nodes stream to the client append-only, so a later edit
  never crosses the wire; and ``trace.state`` is not serialized at all. ``info`` is the
  trace's own free-form field, re-sent whenever it changes.

Both register under the plugin id ``PLUGIN_ID`` when this module loads them: verifiers
imports a plugin id as a top-level module name, which a dotted path cannot be. A process
that builds or loads this environment (the server, and the orchestrator that loads the
taskset) calls ``load_plugin()`` (``env_config`` and ``serving`` do) first.

Server rules: ``serving`` binds loopback (``tcp://127.0.0.1``, ``tcp://localhost``,
``tcp://[::1]``) or ``ipc://`` only. verifiers' wire protocol carries no credential, so a
bearer token cannot be checked; other addresses are refused, reach a remote server through
an SSH tunnel. Episodes in flight are capped by ``max_concurrent`` (more wait for a slot);
``episode_timeout`` bounds each episode; a bad request (unknown task, bad data) fails alone.
Leaving ``serving`` stops the server and waits for every episode's teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal
from urllib.parse import urlparse

from llenvs_async import LlenvsError

from .._extras import import_extra
from ..errors import MissingExtraError

__all__ = [
    "PLUGIN_ID",
    "TURN_TOKENS_KEY",
    "VerifiersUnavailableError",
    "env_config",
    "load_plugin",
    "serving",
    "turn_tokens",
]

_log = logging.getLogger("llenvs_async.integrations.verifiers")

PLUGIN_ID = "llenvs_async_verifiers"
"""The taskset and harness id verifiers loads our plugin by."""

TURN_TOKENS_KEY = "llenvs_turn_tokens"
"""The ``trace.info`` key of every turn's token ids (a list of dumped ``TurnTokens``)."""

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


# The name this module's error had before every extra shared one (kept for ``except`` clauses).
VerifiersUnavailableError = MissingExtraError


def load_plugin() -> ModuleType:
    """Import and register the plugin (taskset and harness under ``PLUGIN_ID``)."""
    import_extra("verifiers.v1", extra="verifiers", what="llenvs_async.integrations.verifiers",
                 package="verifiers 0.4")  # fmt: skip
    return importlib.import_module("llenvs_async.integrations._verifiers_plugin")


def env_config(
    source: str | Path,
    *,
    tasks: Sequence[str] = (),
    max_steps: int = 30,
    action_format: Literal["text", "tools"] = "tools",
    container_runtime: Literal["runc", "gvisor"] = "runc",
    step_timeout: float | None = None,
    command_timeout_sec: float = 180.0,
    max_tokens: int = 512,
    context_length: int | None = None,
    tool_choice: str | None = None,
    system_prompt: str | None = None,
    episode_timeout: float | None = 3600.0,
) -> Any:
    """verifiers' ``EnvConfig`` for the Harbor tasks in ``source`` (a local directory),
    played by our runner; ``tasks`` keeps only these names. The sampling (``max_tokens``
    included) is the caller's: ``max_tokens`` applies when its sampling sets none."""
    load_plugin()
    from verifiers.v1.utils.loaders import resolve_env_config  # type: ignore[import-untyped]

    root = Path(source).expanduser().resolve()
    if not root.is_dir():
        raise LlenvsError(
            f"source must be a local directory of Harbor tasks, got {str(source)!r}",
            field="source",
            value=str(source),
        )
    harness: dict[str, Any] = {
        "id": PLUGIN_ID,
        "max_steps": max_steps,
        "action_format": action_format,
        "container_runtime": container_runtime,
        "step_timeout": step_timeout,
        "command_timeout_sec": command_timeout_sec,
        "max_tokens": max_tokens,
        "context_length": context_length,
        "tool_choice": tool_choice,
        "system_prompt": system_prompt,
    }
    return _validated(
        resolve_env_config,
        {
            "taskset": {"id": PLUGIN_ID, "source": str(root), "tasks": list(tasks)},
            # the harness runs in this process; its containers are ours
            "agent": {"runtime": {"type": "subprocess"}, "harness": harness},
            "timeout": {"episode": episode_timeout},
            "retries": {"max_retries": 0},
        },
    )


@contextlib.asynccontextmanager
async def serving(
    config: Any,
    *,
    address: str = "tcp://127.0.0.1:5000",
    max_concurrent: int = 4,
    close_timeout: float = 60.0,
) -> AsyncIterator[Any]:
    """verifiers' ``EnvServer`` for ``config`` (see ``env_config``) running on this event
    loop; yields it (``server.address`` is the bound address, ``:0`` picks a free port).
    On exit the server stops and every episode's teardown is awaited (``close_timeout``)."""
    plugin = load_plugin()
    _check_address(address)
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
        raise TypeError(f"max_concurrent must be an int, got {max_concurrent!r}")
    if max_concurrent < 1:
        raise LlenvsError(
            f"max_concurrent must be >= 1, got {max_concurrent}",
            field="max_concurrent",
            value=max_concurrent,
        )
    from verifiers.v1.serve import EnvServer  # type: ignore[import-untyped]

    server = EnvServer(config=config, address=address, max_concurrent=max_concurrent)
    loop_task = asyncio.create_task(server.run(), name="llenvs-verifiers-server")
    try:
        yield server
    finally:
        loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(loop_task)
        live = [task for task in plugin.LIVE if not task.done()]
        if live:
            _, pending = await asyncio.shield(asyncio.wait(live, timeout=close_timeout))
            if pending:
                _log.error(
                    "%d verifiers episodes did not finish their teardown in %.0f s",
                    len(pending),
                    close_timeout,
                )


def turn_tokens(trace: Any) -> list[Any]:
    """Every turn's token ids of a trace our harness played (an orchestrator's ``WireTrace``
    or a live ``Trace``), as verifiers' ``TurnTokens``, in model-call order."""
    load_plugin()
    from pydantic import ValidationError
    from verifiers.v1.types import TurnTokens  # type: ignore[import-untyped]

    turns = trace.info.get(TURN_TOKENS_KEY, [])
    try:
        return [TurnTokens.model_validate(turn) for turn in turns]
    except (ValidationError, TypeError) as exc:
        raise LlenvsError(
            f"trace.info[{TURN_TOKENS_KEY!r}] is not a list of TurnTokens: {exc}",
            field=f"info.{TURN_TOKENS_KEY}",
            value=turns,
        ) from exc


def _check_address(address: str) -> None:
    """Loopback TCP or ipc only: the wire protocol carries no credential to check."""
    if not isinstance(address, str):
        raise TypeError(f"address must be a str, got {address!r}")
    if address.startswith("ipc://"):
        return
    parsed = urlparse(address)
    if parsed.scheme == "tcp" and parsed.hostname in _LOOPBACK:
        return
    raise LlenvsError(
        f"address {address!r} is not loopback: verifiers' env-server protocol carries no "
        "credential, so this server binds only tcp://127.0.0.1:PORT (or localhost, [::1]) "
        "or ipc://PATH; reach it from another machine through an SSH tunnel",
        field="address",
        value=address,
    )


def _validated(resolve: Any, data: dict[str, Any]) -> Any:
    """``resolve(data)``, a pydantic validation error translated to ours (naming the field)."""
    from pydantic import ValidationError

    try:
        return resolve(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise LlenvsError(
            f"bad verifiers env config: {field}: {first['msg']} (got {first.get('input')!r})",
            field=field,
            value=first.get("input"),
        ) from exc
