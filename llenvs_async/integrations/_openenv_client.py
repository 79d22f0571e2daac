"""Any OpenEnv server as an llenvs-async ``Environment``: ``OpenEnvEnvironment``.

One instance holds one WebSocket session (OpenEnv's ``GenericEnvClient``, dict actions and
observations), so it is not pure: the runner makes one per rollout with ``openenv_factory``
and restores saved states by replay (``reset(task, seed)`` then the action prefix), which
is exact when the server's environment is deterministic given its seed.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from llenvs_async import (
    Action,
    BaseEnvironment,
    EnvError,
    Observation,
    State,
    StepResult,
)
from llenvs_async.env import new_episode_id

__all__ = ["OpenEnvEnvironment", "openenv_factory"]

ActionFn = Callable[[Action], Mapping[str, Any]]


class OpenEnvEnvironment(BaseEnvironment):
    """An OpenEnv server's session (``url``: ``http(s)://`` or ``ws(s)://``) as an
    environment.

    An action becomes ``{action_field: action.text}`` (or ``to_action(action)``); the
    observation's text is its ``observation_field`` (default: the JSON of the whole
    observation), its ``data`` the observation dict; the server's ``reward`` (None: 0.0)
    and ``done`` (termination) are the step's. ``reset(task, seed=...)`` sends ``seed``
    and, when a task is given, ``{task_field: task}``. ``token`` is sent as
    ``Authorization: Bearer``. Server errors, timeouts and dropped connections raise
    ``EnvError`` (the next reset opens a new session).
    """

    pure_step = False

    def __init__(
        self,
        url: str,
        *,
        action_field: str = "message",
        to_action: ActionFn | None = None,
        observation_field: str | None = None,
        task_field: str | None = "task",
        token: str | None = None,
        max_steps: int | None = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(max_steps=max_steps)
        if not isinstance(url, str) or not url.startswith(
            ("http://", "https://", "ws://", "wss://")
        ):
            raise ValueError(f"url must be an http(s):// or ws(s):// URL, got {url!r}")
        for name, value in (("connect_timeout_s", connect_timeout_s),
                            ("message_timeout_s", message_timeout_s)):  # fmt: skip
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if to_action is not None and not callable(to_action):
            raise TypeError(f"to_action must be callable, got {to_action!r}")
        _require()
        self.url = url.rstrip("/")
        self.action_field = action_field
        self.to_action = to_action
        self.observation_field = observation_field
        self.task_field = task_field
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeouts = (connect_timeout_s, message_timeout_s)
        self._client: Any = None

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        fields: dict[str, Any] = {}
        if seed is not None:
            fields["seed"] = seed
        if task is not None:
            if self.task_field is None:
                raise EnvError(
                    f"task {task!r} given but this OpenEnvEnvironment has task_field=None",
                    task=task,
                )
            fields[self.task_field] = task
        if self._client is None:
            self._client = _client_class()(
                self.url,
                headers=self._headers,
                connect_timeout_s=self._timeouts[0],
                message_timeout_s=self._timeouts[1],
            )
        result = await self._call("reset", self._client.reset(**fields))
        return State(
            observation=self._observation(result.observation),
            task=task,
            episode_id=new_episode_id(),
            terminated=bool(result.done),
            seed=seed,
        )

    async def _step(self, state: State, action: Action) -> StepResult:
        if self._client is None:
            raise EnvError("the OpenEnv session is gone (an earlier error): reset first")
        if self.to_action is not None:
            payload = dict(self.to_action(action))
        else:
            payload = {self.action_field: action.text}
        result = await self._call("step", self._client.step(payload))
        terminated = bool(result.done)
        step = state.step + 1
        truncated = not terminated and self.max_steps is not None and step >= self.max_steps
        next_state = state.advance(
            action,
            self._observation(result.observation),
            terminated=terminated,
            truncated=truncated,
        )
        reward = 0.0 if result.reward is None else float(result.reward)
        return StepResult.of(next_state, reward)

    async def _aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()  # best effort: it swallows errors of a dead connection

    def _observation(self, observation: Any) -> Observation:
        data = dict(observation) if isinstance(observation, Mapping) else {"value": observation}
        if self.observation_field is None:
            text = json.dumps(data, sort_keys=True, default=str)
        elif self.observation_field in data:
            text = str(data[self.observation_field])
        else:
            raise EnvError(
                f"the OpenEnv observation has no field {self.observation_field!r} "
                f"(observation_field); it has {sorted(data)}",
                field=self.observation_field,
            )
        return Observation(text=text, data=data)

    async def _call(self, what: str, work: Awaitable[Any]) -> Any:
        """Await a client call; map OpenEnv's and the connection's errors to ``EnvError``."""
        closed = importlib.import_module("websockets.exceptions").WebSocketException
        try:
            return await work
        except (RuntimeError, ConnectionError, OSError, TimeoutError, closed) as exc:
            lost = not (isinstance(exc, RuntimeError) and str(exc).startswith("Server error"))
            if lost:  # the session is gone with the connection
                client, self._client = self._client, None
                if client is not None:
                    await client.close()
            raise EnvError(
                f"OpenEnv server {self.url}: {what} failed: {type(exc).__name__}: {exc}",
                url=self.url,
                call=what,
                connection_lost=lost,
            ) from exc


def openenv_factory(url: str, **options: Any) -> Callable[[], Awaitable[OpenEnvEnvironment]]:
    """An ``env_factory`` for the runner: a new ``OpenEnvEnvironment(url, **options)``
    (its own server session) per call. The options are checked now."""
    OpenEnvEnvironment(url, **options)  # bad options fail here, not in every rollout

    async def factory() -> OpenEnvEnvironment:
        return OpenEnvEnvironment(url, **options)

    return factory


def _require() -> None:
    from ._openenv_serving import require_openenv

    require_openenv()


@functools.cache
def _client_class() -> type[Any]:
    generic = importlib.import_module("openenv.core.generic_client").GenericEnvClient
    ws_connect = importlib.import_module("websockets.asyncio.client").connect

    class _Client(generic):  # type: ignore[misc,valid-type]
        """``GenericEnvClient`` that can send headers (a bearer token) in the handshake."""

        _ws: Any

        def __init__(self, base_url: str, *, headers: Mapping[str, str], **kw: Any) -> None:
            super().__init__(base_url, **kw)
            self._llenvs_headers = dict(headers)

        async def connect(self) -> Any:
            if self._ws is None and self._llenvs_headers:
                try:
                    self._ws = await ws_connect(
                        self._ws_url,
                        open_timeout=self._connect_timeout,
                        max_size=self._max_message_size,
                        additional_headers=self._llenvs_headers,
                    )
                except Exception as exc:  # what the base class raises for a failed connect
                    raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
            return await super().connect()

    return _Client
