"""The scripted epsilon-oracle policies behind ``--backend scripted`` and the demo."""

from __future__ import annotations

import pytest

from llenvs_async import ChatMessage, GenerationRequest
from llenvs_async.adapters.harbor import (
    HARBOR_DESTRUCTIVE,
    harbor_mistakes,
    harbor_oracle,
    next_solution_command,
)
from llenvs_async.policies import arithmetic_oracle, counter_oracle, fenced, shell_reply

SOLUTION = ("mkdir -p /app/out", "cp a /app/out", "ls /app/out")


def _request(*assistant: str, task: int | str = "t", index: int = 0) -> GenerationRequest:
    messages = [ChatMessage(role="user", content="do the task")]
    for text in assistant:
        messages += [
            ChatMessage(role="assistant", content=text),
            ChatMessage(role="user", content="ok"),
        ]
    return GenerationRequest(
        messages=tuple(messages), task=task, rollout_index=index, step=len(assistant)
    )


def test_next_solution_command_skips_mistakes_and_ends_with_submit() -> None:
    assert next_solution_command(_request(), SOLUTION) == SOLUTION[0]
    assert next_solution_command(_request(SOLUTION[0], "ls -la /app"), SOLUTION) == SOLUTION[1]
    assert next_solution_command(_request(*SOLUTION), SOLUTION) == "SUBMIT"
    # a solution command run out of order does not count
    assert next_solution_command(_request(SOLUTION[1]), SOLUTION) == SOLUTION[0]
    # the oracle's own (fenced) replies count as run too
    replies = [fenced(c) for c in SOLUTION]
    after_a_mistake = _request(replies[0], fenced("ls -la /app"))
    assert next_solution_command(after_a_mistake, SOLUTION) == SOLUTION[1]
    assert next_solution_command(_request(*replies), SOLUTION) == "SUBMIT"


def test_fenced_replies() -> None:
    assert fenced("ls -la") == "```bash\nls -la\n```"
    script = "cat > f <<'EOF'\na `b`\nEOF\nbash f"
    assert fenced(script) == f"```bash\n{script}\n```"  # multi-line scripts stay whole
    with pytest.raises(ValueError, match="triple backtick"):
        fenced("echo ```")
    assert shell_reply("SUBMIT") == "SUBMIT" and shell_reply("DONE", "DONE") == "DONE"
    assert shell_reply("ls") == fenced("ls")


def test_epsilon_zero_is_the_solution_and_epsilon_one_always_errs() -> None:
    perfect = harbor_oracle(lambda task: SOLUTION, epsilon=0.0)
    replies = [fenced(c) for c in SOLUTION]
    assert [perfect(_request(*replies[:k])) for k in range(4)] == [*replies, "SUBMIT"]
    clumsy = harbor_oracle(lambda task: SOLUTION, epsilon=1.0)
    picks = {clumsy(_request(index=i)) for i in range(40)}
    assert fenced(HARBOR_DESTRUCTIVE) in picks and "SUBMIT" in picks
    assert not picks & set(replies)


def test_draws_are_reproducible_and_differ_across_rollouts() -> None:
    a = harbor_oracle(lambda task: SOLUTION, epsilon=0.5, seed=7)
    b = harbor_oracle(lambda task: SOLUTION, epsilon=0.5, seed=7)
    first = [a(_request(index=i)) for i in range(30)]
    assert first == [b(_request(index=i)) for i in range(30)]
    assert 0 < sum(x == fenced(SOLUTION[0]) for x in first) < 30
    other_seed = harbor_oracle(lambda task: SOLUTION, epsilon=0.5, seed=8)
    assert first != [other_seed(_request(index=i)) for i in range(30)]


def test_builtin_oracles() -> None:
    ask = GenerationRequest(
        messages=(
            ChatMessage(role="user", content="Compute 12 * 7. Answer with a single integer."),
        )
    )
    assert arithmetic_oracle()(ask) == "84"
    assert arithmetic_oracle(epsilon=1.0)(ask) in ("83", "85")
    counter = counter_oracle()
    at = GenerationRequest(messages=(ChatMessage(role="user", content="Counter is 3."),), task=3)
    assert counter(at) == "submit"
    below = GenerationRequest(messages=(ChatMessage(role="user", content="Counter is 1."),), task=3)
    assert counter(below) == "inc"
    with pytest.raises(ValueError, match="epsilon"):
        counter_oracle(epsilon=1.5)


def test_harbor_mistakes_follow_the_tasks_workdir() -> None:
    assert harbor_mistakes("/task") == ("ls -la /task", "cat /etc/os-release", "rm -rf /task/*")
    assert "rm" not in " ".join(harbor_mistakes("/"))  # never wipe the whole filesystem
    workdirs = {"a": "/workspace", "b": "/root"}
    clumsy = harbor_oracle(
        lambda task: SOLUTION, epsilon=1.0, mistakes=lambda task: harbor_mistakes(workdirs[task])
    )
    picks = {clumsy(_request(task="a", index=i)) for i in range(40)}
    assert fenced("rm -rf /workspace/*") in picks and not any("/app" in p for p in picks)
    assert fenced("ls -la /root") in {clumsy(_request(task="b", index=i)) for i in range(40)}
