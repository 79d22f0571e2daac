"""Harbor's oracle as a policy: each task's solution (``solve.sh``; a multi-step task's step
solutions with ``SUBMIT`` between them), then ``SUBMIT``; with probability ``epsilon`` a
mistake in the task's working directory instead (``OraclePolicy``'s seeded draws). The
policy replies as a model must: a command as one fenced block, ``SUBMIT`` alone
(``shell_reply``); the commands themselves (``next_solution_command``, ``harbor_mistakes``,
``HARBOR_DESTRUCTIVE``) stay plain, for forced and candidate actions.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable, Sequence

from ...policies import OraclePolicy, shell_reply
from ...types import GenerationRequest
from .episode.steps import oracle_actions
from .tasks.dataset import HarborDataset

__all__ = [
    "HARBOR_DESTRUCTIVE",
    "HARBOR_MISTAKES",
    "dataset_oracle",
    "harbor_mistakes",
    "harbor_oracle",
    "next_solution_command",
    "solution_lookup",
]


def harbor_mistakes(workdir: str) -> tuple[str, ...]:
    """Plausible wrong commands in a task's working directory (harmless but useless) and one
    destructive one that wipes it (none when the workdir is ``/``: that would wipe the OS)."""
    where = shlex.quote(workdir)
    harmless = (f"ls -la {where}", "cat /etc/os-release")
    if workdir.rstrip("/") == "":
        return harmless
    return (*harmless, f"rm -rf {where}/*")


HARBOR_MISTAKES: tuple[str, ...] = harbor_mistakes("/app")
"""The mistakes of a task working in ``/app`` (the example tasks)."""

HARBOR_DESTRUCTIVE = HARBOR_MISTAKES[-1]
"""Wipes an example task's working directory (``/app``): a mistake nothing recovers from."""


def next_solution_command(
    request: GenerationRequest, solution: Sequence[str], submit: str = "SUBMIT"
) -> str:
    """The first solution command not yet run (in order) in the conversation, else ``submit``.

    Commands that are not the expected next one (mistakes) are skipped over, so the
    oracle carries on with the solution after a wrong command. A command counts as run
    whether the conversation shows it plain (a forced action) or ``fenced`` (a reply).
    """
    done = 0
    for message in request.messages:
        if message.role != "assistant" or done == len(solution):
            continue
        if _shows(message.content.strip(), solution[done]):
            done += 1
    return solution[done] if done < len(solution) else submit


_ONE_BLOCK = re.compile(r"```[^\n`]*\n(.*)\n```", re.DOTALL)


def _shows(content: str, command: str) -> bool:
    """An assistant message's stripped ``content`` is ``command``: plain (a forced action
    written as is) or as the whole of one fenced block (a reply, or a forced action the
    conversation renders fenced)."""
    if content == command:
        return True
    block = _ONE_BLOCK.fullmatch(content)
    return block is not None and block[1].strip() == command.strip()


def harbor_oracle(
    solution_of: Callable[[int | str | None], Sequence[str]],
    *,
    epsilon: float = 0.0,
    seed: int = 0,
    mistakes: Sequence[str] | Callable[[int | str | None], Sequence[str]] = HARBOR_MISTAKES,
    submit: str = "SUBMIT",
) -> OraclePolicy:
    """Harbor tasks: runs ``solution_of(task)`` (``HarborTask.solution_commands``: solve.sh
    whole, as one action), then ``submit``; a mistake is one of ``mistakes`` (or
    ``mistakes(task)``, e.g. ``harbor_mistakes`` of the task's workdir) or an early ``submit``.
    Every reply is ``shell_reply``'s: a command fenced, ``submit`` alone.
    """

    def options(request: GenerationRequest) -> Sequence[str]:
        chosen = mistakes(request.task) if callable(mistakes) else mistakes
        return tuple(shell_reply(c, submit) for c in (*chosen, submit))

    return OraclePolicy(
        lambda r: shell_reply(next_solution_command(r, solution_of(r.task), submit), submit),
        options,
        epsilon=epsilon,
        seed=seed,
    )


def solution_lookup(dataset: HarborDataset) -> Callable[[int | str | None], Sequence[str]]:
    """``task -> solution commands`` (``oracle_actions`` of the task), cached."""
    cache: dict[int | str | None, Sequence[str]] = {}

    def lookup(task: int | str | None) -> Sequence[str]:
        if task not in cache:
            cache[task] = oracle_actions(dataset.resolve(task)[1])
        return cache[task]

    return lookup


def dataset_oracle(dataset: HarborDataset, *, epsilon: float = 0.0, seed: int = 0) -> OraclePolicy:
    """``harbor_oracle`` for every task of ``dataset``: its solutions, mistakes in its workdir."""

    @functools.cache
    def mistakes(task: int | str | None) -> Sequence[str]:
        return harbor_mistakes(dataset.resolve(task)[1].declared_workdir)

    return harbor_oracle(solution_lookup(dataset), epsilon=epsilon, seed=seed, mistakes=mistakes)
