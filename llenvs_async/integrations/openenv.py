"""OpenEnv both ways (``pip install 'llenvs-async[openenv]'``).

Serve: any llenvs-async environment behind OpenEnv's own server (``HTTPEnvServer``, its
WebSocket ``/ws`` protocol), one fresh instance per session, torn down when the session
ends, its client vanishes or it idles out::

    from llenvs_async.integrations.openenv import create_app, serving

    app = create_app(env_factory, max_concurrent=8, idle_timeout_s=600)
    async with serving(app, host="127.0.0.1", port=8000) as url:
        ...                               # OpenEnv clients connect to url

Clients send ``{"type": "reset", "data": {"task": ..., "seed": ...}}`` and
``{"type": "step", "data": {"text": "..."}}`` (``EnvClient.reset(task=..., seed=...)`` /
``step({"text": ...})``); observations carry ``text``, ``data``, ``step``,
``terminated``, ``truncated``, ``info``, ``reward`` and ``done``. A bad message gets an
error reply on its own session only.

Consume: any OpenEnv server as an environment of ours (non-pure, one session each)::

    from llenvs_async.integrations.openenv import OpenEnvEnvironment, openenv_factory

    factory = openenv_factory("http://127.0.0.1:8000", action_field="message")
    runner = TrajectoryRunner(await factory(), backend, params, env_factory=factory)
"""

from __future__ import annotations

from ..errors import MissingExtraError

__all__ = [
    "OpenEnvEnvironment",
    "OpenEnvUnavailableError",
    "create_app",
    "is_loopback",
    "openenv_factory",
    "require_openenv",
    "serving",
]

# The name this module's error had before every extra shared one (kept for ``except`` clauses).
OpenEnvUnavailableError = MissingExtraError


from ._openenv_client import OpenEnvEnvironment, openenv_factory  # noqa: E402
from ._openenv_server import create_app  # noqa: E402
from ._openenv_serving import is_loopback, require_openenv, serving  # noqa: E402
