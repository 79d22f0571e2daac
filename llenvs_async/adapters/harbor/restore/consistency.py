"""``validate_replay_consistency``: does replaying a command prefix give the same container state?

Each trial replays the prefix in its own fresh instance (concurrently, every
instance closed), then runs read-only probe commands. Trials that disagree with
each other make the task's replay inconsistent (``date``, ``$RANDOM``, ``mktemp``
and network fetches do that); ``reference_probes`` (e.g. from the live instance a
state was saved from, via ``collect_probes``) are compared too. Probes never
consume steps, never count against the budget and never run the verifier.

The report: ``consistent`` (all trials agree), ``matches_reference`` (all agree
with ``reference_probes``; ``None`` without one), ``probe_outputs`` (one
``{probe: output}`` per trial), ``divergence_details`` (per differing probe: its
``kind``, the ``groups`` of trials that agree, and a ``diff``), ``task_index``,
``task_name`` and ``num_trials``.
"""

from __future__ import annotations

import asyncio
import difflib
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ....env import EnvFactory, replay
from ....types import Action, Trajectory
from ..episode.environment import HarborEnvironment

__all__ = ["collect_probes", "default_probes", "validate_replay_consistency"]

_DIFF_LINES = 12


def default_probes(workdir: str) -> tuple[str, ...]:
    """File tree (type, mode, size; no times) and per-file SHA-256 of ``workdir``,
    and the installed packages (dpkg and pip).
    """
    wd = shlex.quote(workdir)
    return (
        f"(cd {wd} && find . -xdev -printf '%y %M %s %p\\n' | LC_ALL=C sort)",
        f"(cd {wd} && find . -xdev -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)",
        "((dpkg-query -W -f='${Package}=${Version}\\n' 2>/dev/null;"
        " python3 -m pip freeze 2>/dev/null) | LC_ALL=C sort)",
    )


async def collect_probes(
    env: HarborEnvironment, probe_commands: Sequence[str] | None = None
) -> dict[str, str]:
    """``{command: output}`` of probes run in ``env``'s shell (default: ``default_probes``);
    the episode is not affected."""
    commands = tuple(probe_commands) if probe_commands else default_probes(env.workdir)
    return {command: await env.probe(command) for command in commands}


def _actions(trajectory: Sequence[str | Action] | Trajectory) -> tuple[Action, ...]:
    if isinstance(trajectory, Trajectory):
        return trajectory.actions
    if isinstance(trajectory, str):
        raise TypeError("trajectory must be a sequence of commands, not one string")
    return tuple(a if isinstance(a, Action) else Action(text=a) for a in trajectory)


async def _trial(
    env_factory: EnvFactory,
    task_index: int,
    actions: Sequence[Action],
    probe_commands: Sequence[str] | None,
) -> tuple[str, dict[str, str]]:
    env = await env_factory()
    async with env:
        if not isinstance(env, HarborEnvironment):
            raise TypeError(f"env_factory must make HarborEnvironments, got {type(env).__name__}")
        with env.replaying():
            await replay(env, task_index, actions, until=env.is_submit)
        name = env.dataset.tasks[task_index].name
        return name, await collect_probes(env, probe_commands)


def _divergence(
    probe: str, outputs: Sequence[str], labels: Sequence[str], kind: str
) -> dict[str, Any]:
    """Which trials gave which output for one probe, and a diff of the first two variants."""
    variants: dict[str, list[str]] = {}
    for label, output in zip(labels, outputs, strict=True):
        variants.setdefault(output, []).append(label)
    (first, first_labels), (second, second_labels) = list(variants.items())[:2]
    diff = list(
        difflib.unified_diff(
            first.splitlines(),
            second.splitlines(),
            fromfile=",".join(first_labels),
            tofile=",".join(second_labels),
            lineterm="",
            n=0,
        )
    )
    return {
        "probe": probe,
        "kind": kind,
        "groups": list(variants.values()),
        "diff": "\n".join(diff[:_DIFF_LINES] + (["..."] if len(diff) > _DIFF_LINES else [])),
    }


async def validate_replay_consistency(
    env_factory: EnvFactory,
    task_index: int,
    trajectory: Sequence[str | Action] | Trajectory,
    probe_commands: Sequence[str] | None = None,
    num_trials: int = 3,
    reference_probes: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Replay ``trajectory`` (commands, actions or a ``Trajectory``; ``SUBMIT`` ends it) in
    ``num_trials`` fresh instances and compare probes; the result keys are in the module doc."""
    if num_trials < 1:
        raise ValueError(f"num_trials must be >= 1, got {num_trials!r}")
    actions = _actions(trajectory)
    probes = probe_commands
    if probes is None and reference_probes is not None:
        probes = tuple(reference_probes)
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(_trial(env_factory, task_index, actions, probes))
                for _ in range(num_trials)
            ]
    except ExceptionGroup as group:
        raise group.exceptions[0] from group
    results = [t.result() for t in tasks]
    outputs = [probes_out for _, probes_out in results]
    labels = [f"trial{i}" for i in range(num_trials)]
    details = [
        _divergence(probe, [o[probe] for o in outputs], labels, "between_trials")
        for probe in outputs[0]
        if len({o[probe] for o in outputs}) > 1
    ]
    matches: bool | None = None
    if reference_probes is not None:
        matches = True
        for probe, expected in reference_probes.items():
            got = [o.get(probe) for o in outputs]
            if any(g != expected for g in got):
                matches = False
                details.append(
                    _divergence(
                        probe,
                        [expected, *(g if g is not None else "<not probed>" for g in got)],
                        ["reference", *labels],
                        "vs_reference",
                    )
                )
    return {
        "consistent": not any(d["kind"] == "between_trials" for d in details),
        "matches_reference": matches,
        "probe_outputs": outputs,
        "divergence_details": details,
        "task_index": task_index,
        "task_name": results[0][0],
        "num_trials": num_trials,
    }
