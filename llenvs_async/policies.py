"""Scripted epsilon-oracle policies (the CLI's scripted backend, the demo) and a prompt
builder that shows a restored state's history.

An oracle knows the right next action; with probability ``epsilon`` it takes a
mistake instead (a wrong or destructive action). Draws are seeded per
``(seed, task, rollout_index, step)``, so a run is reproducible and the rollouts
of one batch still differ from each other.
"""

from __future__ import annotations

import random
import re
import shlex
from collections.abc import Callable, Sequence

from .types import GenerationRequest

__all__ = [
    "HARBOR_DESTRUCTIVE",
    "HARBOR_MISTAKES",
    "OraclePolicy",
    "arithmetic_oracle",
    "chain_oracle",
    "counter_oracle",
    "harbor_mistakes",
    "harbor_oracle",
    "next_solution_command",
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

_PROBLEM = re.compile(r"Compute (-?\d+) ([+*-]) (-?\d+)")
_COUNTER = re.compile(r"Counter is (-?\d+)")


class OraclePolicy:
    """Returns ``solve(request)``, or with probability ``epsilon`` one of ``mistakes(request)``."""

    def __init__(
        self,
        solve: Callable[[GenerationRequest], str],
        mistakes: Callable[[GenerationRequest], Sequence[str]],
        *,
        epsilon: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
        self.solve = solve
        self.mistakes = mistakes
        self.epsilon = epsilon
        self.seed = seed

    def __call__(self, request: GenerationRequest) -> str:
        rng = random.Random(f"{self.seed}:{request.task}:{request.rollout_index}:{request.step}")
        if self.epsilon and rng.random() < self.epsilon:
            options = self.mistakes(request)
            if options:
                return rng.choice(list(options))
        return self.solve(request)


def _first_user(request: GenerationRequest) -> str:
    return next((m.content for m in request.messages if m.role == "user"), "")


def _last_user(request: GenerationRequest) -> str:
    return next((m.content for m in reversed(request.messages) if m.role == "user"), "")


def _arithmetic_answer(request: GenerationRequest) -> int:
    match = _PROBLEM.search(_first_user(request))
    if match is None:
        raise ValueError(f"not an ArithmeticEnv prompt: {_first_user(request)!r:.80}")
    a, op, b = int(match[1]), match[2], int(match[3])
    return a + b if op == "+" else a - b if op == "-" else a * b


def arithmetic_oracle(*, epsilon: float = 0.0, seed: int = 0) -> OraclePolicy:
    """ArithmeticEnv: the right answer; mistakes are off-by-one answers."""
    return OraclePolicy(
        lambda r: str(_arithmetic_answer(r)),
        lambda r: (str(_arithmetic_answer(r) + 1), str(_arithmetic_answer(r) - 1)),
        epsilon=epsilon,
        seed=seed,
    )


def chain_oracle(*, epsilon: float = 0.0, seed: int = 0) -> OraclePolicy:
    """ChainEnv: always ``right``; the mistake is ``left``."""
    return OraclePolicy(lambda r: "right", lambda r: ("left",), epsilon=epsilon, seed=seed)


def _counter_action(request: GenerationRequest) -> str:
    match = _COUNTER.search(_last_user(request))
    target = request.task if isinstance(request.task, int) else 3
    value = int(match[1]) if match else 0
    return "inc" if value < target else "dec" if value > target else "submit"


def counter_oracle(*, epsilon: float = 0.0, seed: int = 0) -> OraclePolicy:
    """CounterEnv: step towards the target, then ``submit``; mistakes are ``dec`` and an
    early ``submit``.
    """
    return OraclePolicy(_counter_action, lambda r: ("dec", "submit"), epsilon=epsilon, seed=seed)


def next_solution_command(
    request: GenerationRequest, solution: Sequence[str], submit: str = "SUBMIT"
) -> str:
    """The first solution command not yet run (in order) in the conversation, else ``submit``.

    Commands that are not the expected next one (mistakes) are skipped over, so the
    oracle carries on with the solution after a wrong command.
    """
    done = 0
    for message in request.messages:
        if message.role != "assistant" or done == len(solution):
            continue
        if message.content.strip() == solution[done]:
            done += 1
    return solution[done] if done < len(solution) else submit


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
    """

    def options(request: GenerationRequest) -> Sequence[str]:
        chosen = mistakes(request.task) if callable(mistakes) else mistakes
        return (*chosen, submit)

    return OraclePolicy(
        lambda r: next_solution_command(r, solution_of(r.task), submit),
        options,
        epsilon=epsilon,
        seed=seed,
    )
