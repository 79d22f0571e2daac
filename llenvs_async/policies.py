"""Scripted epsilon-oracle policies (the CLI's scripted backend, the demo) for the built-in
environments; Harbor's oracle lives with its adapter (``adapters/harbor/oracle.py``).

A shell task (``DockerEnvironment``, ``HarborEnvironment``, gVisor sandboxes) parses what a
backend generated strictly: a command is exactly one fenced block, a submit is the submit
word alone. A scripted policy replying to one wraps its commands with ``fenced`` (or
``shell_reply``, which leaves the submit word as it is).

An oracle knows the right next action; with probability ``epsilon`` it takes a
mistake instead (a wrong or destructive action). Draws are seeded per
``(seed, task, rollout_index, step)``, so a run is reproducible and the rollouts
of one batch still differ from each other.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from .types import GenerationRequest

__all__ = [
    "OraclePolicy",
    "arithmetic_oracle",
    "chain_oracle",
    "counter_oracle",
    "fenced",
    "shell_reply",
]


def fenced(command: str) -> str:
    """``command`` as a model replies with it to a shell task: exactly one fenced block (a
    ```` ```bash ```` line, the command, a ```` ``` ```` line); a multi-line script stays
    whole inside it. The environment runs the block's content (what ``info["command"]``
    shows). A command holding a triple backtick cannot be fenced (the block would end
    there): ``ValueError``."""
    if "```" in command:
        raise ValueError(f"a command with a triple backtick cannot be fenced: {command!r:.80}")
    return f"```bash\n{command}\n```"


def shell_reply(command: str, submit: str = "SUBMIT") -> str:
    """A scripted shell-task reply: the submit word alone as it is, any other command
    ``fenced``."""
    return command if command == submit else fenced(command)


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
