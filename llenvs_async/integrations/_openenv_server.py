"""Our environments behind OpenEnv's own server: ``create_app``.

OpenEnv's ``HTTPEnvServer`` gives every WebSocket session (``/ws``) its own OpenEnv
``Environment``, made by a zero-argument factory in a per-session worker thread, and calls
its sync ``close()`` in that thread when the session ends: a ``close`` message or a client
that vanished (``WebSocketDisconnect``); our idle reaper ends sessions through that same
``close()``, on the loop. It awaits ``reset_async`` /
``step_async`` on its event loop when a class overrides them. ``_Session`` does exactly
that: the llenvs-async instance is made (by our async factory) at the session's first
``reset``, on the server's loop, and ``close()`` blocks its worker thread until the
instance's ``aclose()`` has run on that loop. The app is registered in OpenEnv's
``production`` mode: only ``/ws`` sessions (capped) can reach an environment; the stateless
HTTP ``/reset`` and ``/step`` (one fresh instance per request, uncapped) are not served.
OpenEnv's own idle reaper is off (it counts a call as activity only once it finishes, so it
would close an environment in the middle of a long step); ``_Hub`` runs ours instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import logging
import time
import weakref
from collections.abc import Iterator
from typing import Any

from llenvs_async import Action, ClosedError, EnvError, EnvFactory, State

from ._openenv_serving import CLOSE_TIMEOUT, BearerAuth

__all__ = ["create_app"]

_log = logging.getLogger("llenvs_async.integrations.openenv")


class _Hub:
    """What one app shares: the factory, the server's loop, the live sessions, the idle
    reaper and the closes scheduled from the loop thread (awaited at shutdown)."""

    def __init__(self, env_factory: EnvFactory, idle_timeout_s: float | None) -> None:
        self.env_factory = env_factory
        self.idle_timeout_s = idle_timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        self.closing: set[asyncio.Task[None]] = set()
        self.reaper: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.idle_timeout_s is not None:
            self.reaper = asyncio.create_task(
                self._reap(self.idle_timeout_s), name="llenvs-openenv-idle-reaper"
            )

    async def shutdown(self) -> None:
        """Stop the reaper, then close every instance still open (sessions end first when
        clients disconnect)."""
        reaper, self.reaper = self.reaper, None
        if reaper is not None:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
        for session in list(self.sessions):
            await session.aclose_instance()
        if self.closing:
            await asyncio.wait(self.closing)

    async def _reap(self, timeout_s: float) -> None:
        """End each session idle (no call in flight) for ``timeout_s``, waking at the
        earliest such deadline: a call that ends later only moves its deadline later."""
        while True:
            now = time.monotonic()
            wake = now + timeout_s  # the earliest deadline a session can get from now on
            for session in list(self.sessions):
                deadline = session.idle_deadline(timeout_s)
                if deadline is None:
                    continue
                if deadline <= now:
                    session.end_idle(timeout_s)
                else:
                    wake = min(wake, deadline)
            await asyncio.sleep(wake - now)


@functools.cache
def _models() -> tuple[type[Any], type[Any], type[Any]]:
    """OpenEnv's ``Environment`` base, and our ``Action`` / ``Observation`` models."""
    types = importlib.import_module("openenv.core.env_server.types")
    interfaces = importlib.import_module("openenv.core.env_server.interfaces")
    field = importlib.import_module("pydantic").Field

    class LlenvsAction(types.Action):  # type: ignore[misc,name-defined]
        """What the agent does: the text our environment parses (a command, the submit
        word, or a model's whole reply)."""

        text: str = field(..., description="The action text (e.g. a shell command)")

    class LlenvsObservation(types.Observation):  # type: ignore[misc,name-defined]
        """Our ``Observation`` and step outcome; ``done`` = terminated or truncated."""

        text: str = field(default="", description="The observation text")
        data: dict[str, Any] = field(default_factory=dict)
        step: int = field(default=0, description="Steps taken since reset")
        terminated: bool = False
        truncated: bool = False
        info: dict[str, Any] = field(default_factory=dict)

    return interfaces.Environment, LlenvsAction, LlenvsObservation


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (anything else becomes its ``str``)."""
    return json.loads(json.dumps(value, default=str))


@functools.cache
def _session_class() -> type[Any]:
    """The OpenEnv ``Environment`` subclass that runs one session (made once, lazily)."""
    base, _, observation_cls = _models()
    state_cls = importlib.import_module("openenv.core.env_server.types").State

    class _Session(base):  # type: ignore[misc,valid-type]
        """One OpenEnv session: one llenvs-async instance, made at the first reset."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self, hub: _Hub) -> None:
            super().__init__()
            self._hub = hub
            self._instance: Any = None
            self._state: State | None = None
            self._ended: str | None = None
            self._calls = 0  # reset/step calls in flight: the session is active meanwhile
            self._last_call_end = time.monotonic()
            loop = hub.loop  # made in a worker thread: join the set on the loop, not mid-reap
            if loop is None or _on_loop_thread(loop):
                hub.sessions.add(self)
            else:
                loop.call_soon_threadsafe(hub.sessions.add, self)

        def idle_deadline(self, timeout_s: float) -> float | None:
            """When this session has been idle ``timeout_s`` (``time.monotonic``); ``None``
            while a call is in flight or once it has ended."""
            if self._calls or self._ended is not None:
                return None
            return self._last_call_end + timeout_s

        def end_idle(self, timeout_s: float) -> None:
            """End the session for idling, by the path every end takes (``close``)."""
            self._ended = f"it was closed: idle for over {timeout_s:g} s"
            self.close()

        @contextlib.contextmanager
        def _call(self) -> Iterator[None]:
            """Mark one reset/step in flight on an open session (never reaped meanwhile)."""
            self._check_open()
            self._calls += 1
            try:
                yield
            finally:
                self._calls -= 1
                self._last_call_end = time.monotonic()

        async def reset_async(
            self,
            seed: int | None = None,
            episode_id: str | None = None,
            task: int | str | None = None,
            **kwargs: Any,
        ) -> Any:
            with self._call():
                return await self._reset(seed, task, kwargs)

        async def _reset(
            self, seed: int | None, task: int | str | None, kwargs: dict[str, Any]
        ) -> Any:
            if kwargs:
                raise EnvError(
                    f"reset got unknown fields {sorted(kwargs)}: it takes seed and task",
                    fields=sorted(kwargs),
                )
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise EnvError(f"reset field 'seed' must be an integer, got {seed!r}", seed=seed)
            if task is not None and not isinstance(task, int | str):
                raise EnvError(f"reset field 'task' must be an int or str, got {task!r}")
            if self._instance is None:
                self._instance = await self._hub.env_factory()
            self._state = None
            state = await self._instance.reset(task, seed=seed)
            self._state = state
            return observation_cls(
                text=state.observation.text,
                data=_jsonable(dict(state.observation.data)),
                step=state.step,
                done=state.done,
                terminated=state.terminated,
                truncated=state.truncated,
                info=_jsonable(dict(state.info)),
                metadata={"episode_id": state.episode_id, "task": _jsonable(state.task)},
            )

        async def step_async(self, action: Any, timeout_s: float | None = None, **_: Any) -> Any:
            with self._call():
                return await self._step(action, timeout_s)

        async def _step(self, action: Any, timeout_s: float | None) -> Any:
            state = self._state
            if state is None:
                raise EnvError("step before reset: send a reset first")
            if state.done:
                raise EnvError(
                    f"the episode is over (step {state.step}, "
                    f"{'terminated' if state.terminated else 'truncated'}): send a reset",
                    step=state.step,
                )
            self._state = None  # an interrupted step leaves no state to step from
            async with asyncio.timeout(timeout_s):
                result = await self._instance.step(state, Action(text=action.text))
            nxt = result.next_state
            self._state = nxt
            return observation_cls(
                text=nxt.observation.text,
                data=_jsonable(dict(nxt.observation.data)),
                step=nxt.step,
                reward=result.reward,
                done=result.terminated or result.truncated,
                terminated=result.terminated,
                truncated=result.truncated,
                info=_jsonable(dict(result.info)),
                metadata={"episode_id": nxt.episode_id},
            )

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
            return self._from_thread(self.reset_async(seed, episode_id, **kw))

        def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            return self._from_thread(self.step_async(action, timeout_s, **kw))

        @property
        def state(self) -> Any:
            current = self._state
            if current is None:
                return state_cls(episode_id=None, step_count=0)
            return state_cls(
                episode_id=current.episode_id,
                step_count=current.step,
                task=_jsonable(current.task),
                terminated=current.terminated,
                truncated=current.truncated,
            )

        def close(self) -> None:
            """Called by OpenEnv when the session ends: tear the instance down (blocking a
            worker thread; scheduled and awaited at shutdown when on the loop's thread)."""
            self._ended = self._ended or "it was closed (its client closed it or went away)"
            loop = self._hub.loop
            if self._instance is None or loop is None:
                return
            if _on_loop_thread(loop):
                task = loop.create_task(self.aclose_instance())
                self._hub.closing.add(task)
                task.add_done_callback(self._hub.closing.discard)
                return
            try:
                future = asyncio.run_coroutine_threadsafe(self.aclose_instance(), loop)
                future.result(CLOSE_TIMEOUT)
            except Exception:
                _log.exception("closing an OpenEnv session's environment failed")

        async def aclose_instance(self) -> None:
            self._ended = self._ended or "the server shut down"
            instance, self._instance = self._instance, None
            if instance is not None:
                await instance.aclose()

        def _check_open(self) -> None:
            if self._ended is not None:
                raise ClosedError(f"this OpenEnv session ({self._ended})")

        def _from_thread(self, work: Any) -> Any:
            loop = self._hub.loop
            if loop is None or _on_loop_thread(loop):
                work.close()
                raise EnvError("call reset_async/step_async on the server's event loop")
            return asyncio.run_coroutine_threadsafe(work, loop).result()

    return _Session


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def create_app(
    env_factory: EnvFactory,
    *,
    max_concurrent: int = 8,
    idle_timeout_s: float | None = 600.0,
    token: str | None = None,
) -> Any:
    """A FastAPI app (OpenEnv's ``HTTPEnvServer`` routes, ``production`` mode) serving a
    fresh instance of ``env_factory`` per ``/ws`` session.

    A session ends, closing its instance exactly once, when its client sends ``close`` or
    goes away, when the server shuts down, or when ``idle_timeout_s`` seconds pass with no
    reset or step in flight (measured from the end of its last call, or from its start;
    ``None``: never). A call in flight, however long, keeps it alive. After an idle end the
    connection stays open and every reset or step is answered with a "closed" error; its
    slot is freed when the client leaves. ``max_concurrent`` caps connected sessions (one
    more is refused with ``CAPACITY_REACHED``); ``token``, when given, is required as
    ``Authorization: Bearer <token>`` on every request and session.
    """
    _require_openenv()
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
        raise TypeError(f"max_concurrent must be an int, got {max_concurrent!r}")
    if max_concurrent < 1:
        raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
    if idle_timeout_s is not None and not idle_timeout_s > 0:
        raise ValueError(f"idle_timeout_s must be > 0 or None, got {idle_timeout_s!r}")
    if token is not None and (not isinstance(token, str) or len(token) < 16):
        raise ValueError("token must be a string of at least 16 characters")
    if not callable(env_factory):
        raise TypeError(f"env_factory must be an async zero-argument callable, got {env_factory!r}")
    http_server = importlib.import_module("openenv.core.env_server.http_server")
    types = importlib.import_module("openenv.core.env_server.types")
    fastapi = importlib.import_module("fastapi")
    _, action_cls, observation_cls = _models()
    hub = _Hub(env_factory, idle_timeout_s)
    session_cls: Any = _session_class()  # a class (in a partial): OpenEnv reads its flags
    server = http_server.HTTPEnvServer(
        functools.partial(session_cls, hub),
        action_cls,
        observation_cls,
        concurrency_config=types.ConcurrencyConfig(
            max_concurrent_envs=max_concurrent, session_timeout=None
        ),
    )
    app = fastapi.FastAPI(title="llenvs-async environments (OpenEnv)")
    app.router.on_startup.append(hub.startup)
    server.register_routes(app, mode="production")
    app.router.on_shutdown.append(hub.shutdown)
    app.state.llenvs_hub = hub
    app.state.llenvs_token = token is not None
    if token is not None:
        app.add_middleware(BearerAuth, token=token)
    return app


def _require_openenv() -> None:
    from ._openenv_serving import require_openenv

    require_openenv()
