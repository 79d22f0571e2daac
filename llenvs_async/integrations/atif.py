"""ATIF (Harbor's Agent Trajectory Interchange Format): our trajectories out, any agent's in.

``to_atif(trajectory)`` is one ATIF document (a JSON dict, ``ATIF-v1.5``): a user step with
the initial observation, then one agent step per transition (message, reasoning, tool calls
and their results, prompt / completion token ids and logprobs); what ATIF has no field for
(rewards, info, ``hidden``, the failure) goes under ``extra["llenvs_async"]``, so
``from_atif(to_atif(t))`` gives ``t`` back. ``from_atif`` also reads what any Harbor agent
wrote, as replayable shell commands. Pure functions over dicts, implemented with the other
file formats (``llenvs_async.serialization``, which the CLI and viewer use); only
``validate`` needs Harbor's models (``pip install 'llenvs-async[atif]'``).
"""

from __future__ import annotations

from ..serialization.atif import (
    ATIF_VERSION,
    EXTRA_KEY,
    TRAJECTORY_FILE,
    AtifError,
    AtifUnavailableError,
    CommandOf,
    find_atif_files,
    from_atif,
    is_atif,
    iter_atif,
    read_atif,
    shell_command,
    to_atif,
    validate,
    write_atif,
)

__all__ = [
    "ATIF_VERSION",
    "EXTRA_KEY",
    "AtifError",
    "AtifUnavailableError",
    "CommandOf",
    "TRAJECTORY_FILE",
    "find_atif_files",
    "from_atif",
    "is_atif",
    "iter_atif",
    "read_atif",
    "shell_command",
    "to_atif",
    "validate",
    "write_atif",
]
