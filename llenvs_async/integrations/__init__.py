"""Thin adapters to other projects, one module each, each behind its own extra.

Leaves of the package: nothing in the core imports them (the CLI's ``serve-openenv`` and
``serve-verifiers`` commands reach them only inside the command), each imports its project lazily
(inside functions; a missing one raises an error naming the extra to install) and builds on
the runner's public API only, never a second rollout loop.

- ``llenvs_async.integrations.trl``: TRL's ``GRPOTrainer(rollout_func=...)`` driven by a
  ``TrajectoryRunner`` in token mode (``pip install 'llenvs-async[trl]'``).
- ``llenvs_async.integrations.trl_env``: TRL's ``GRPOTrainer(environment_factory=...)`` over
  Harbor tasks in containers (tools ``bash`` / ``submit``, the verifier's reward).
- ``llenvs_async.integrations.skyrl``: SkyRL's ``GeneratorInterface`` over a token-mode runner
  (``pip install 'llenvs-async[skyrl]'``; SkyRL itself needs Python >= 3.12).
- ``llenvs_async.integrations.verl``: verl's ``AgentLoopBase`` (``LlenvsAgentLoop``) generating
  through verl's ``server_manager`` (``pip install 'llenvs-async[verl]'``).
- ``llenvs_async.integrations.openenv``: our environments behind OpenEnv's server
  (``create_app``, ``llenvs-async serve-openenv``) and OpenEnv servers as our environments
  (``OpenEnvEnvironment``) (``pip install 'llenvs-async[openenv]'``).
- ``llenvs_async.integrations.verifiers``: our Harbor tasks as a verifiers v1 taskset + harness
  served by verifiers' own ``EnvServer`` (``llenvs-async serve-verifiers``), for prime-rl
  (``pip install 'llenvs-async[verifiers]'``).
- ``llenvs_async.integrations.atif``: Harbor's ATIF trajectories, ``to_atif`` / ``from_atif``
  (pure; ``validate`` needs ``pip install 'llenvs-async[atif]'``).
"""

from __future__ import annotations

__all__: list[str] = []
