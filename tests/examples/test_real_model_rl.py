"""``examples/_real_model_rl.py`` (``train_agent_rl.py --model smollm2-135m-instruct``).

The update test would fail with a flipped advantage, a loss that ignores it, or no optimizer
step: one policy-gradient step on the real model must raise the logprob of a reply with a positive
advantage and lower that of one with a negative advantage, both on the same prompt. The run
test drives every phase once on the real engine and real containers.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from llenvs_async import Action, Observation, State
from llenvs_async.types import Completion, Transition
from tests.engine.conftest import real_model, vllm_ready  # noqa: F401  (fixtures)

from .conftest import docker_ready, load_example, run_example  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("_real_model_rl.py")


def _sample(prompt: list[int], reply: list[int]) -> Transition:
    state = State(observation=Observation(text="task"), task=0)
    action = Action(text="reply")
    return Transition(
        state=state, action=action, next_state=state.advance(action, Observation(text="")),
        reward=0.0,
        completion=Completion(text="reply", token_ids=tuple(reply), prompt_token_ids=tuple(prompt)),
    )  # fmt: skip


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_a_policy_gradient_step_moves_the_real_model_towards_the_positive_advantage(
    example: ModuleType,
    real_model: Path,  # noqa: F811
) -> None:
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_model)
    messages = [{"role": "user", "content": "Create a directory named /app/cedar"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    good, bad = (tokenizer.encode(f"```bash\n{c}\n```\n") for c in ("mkdir /app/cedar", "ls"))
    policy = example.RealPolicy(str(real_model), example.Config(lr=1e-5))
    pairs = [(prompt, good), (prompt, bad)]

    def scored() -> list[float]:
        with torch.no_grad():
            return [float(lp.sum()) for lp in policy.logprobs(pairs)]

    before = scored()
    loss = policy.train([(_sample(prompt, good), 1.0), (_sample(prompt, bad), -1.0)])
    after = scored()
    assert loss != 0.0
    assert after[0] > before[0] + 0.05, (before, after)
    assert after[1] < before[1] - 0.05, (before, after)


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_shared_prefix_logprobs_equal_the_plain_forward_on_the_real_model(
    real_model: Path,  # noqa: F811
) -> None:
    """Running the shared system block once and only the completions through the head gives
    the numbers of one plain forward pass per pair (to float error), at temperature 1 and
    at a lower one (the logits divided by it, as the engine samples)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llenvs_async.testing.torch_logprobs import completion_logprobs

    example = load_example("_agent_rl_logprobs.py")
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    model = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32)
    system = {"role": "system", "content": "You run one shell command per reply. " * 20}
    pairs = []
    for i, task in enumerate(("Delete the file /app/a.tmp", "Count the lines", "Make /app/x")):
        text = tokenizer.apply_chat_template(
            [system, {"role": "user", "content": task}], add_generation_prompt=True, tokenize=False
        )
        reply = tokenizer.encode(f"```bash\nls -{'l' * (i + 1)}\n```\n")
        pairs.append((tokenizer.encode(text, add_special_tokens=False), reply))
    assert example.common_prefix([p for p, _ in pairs]) > 100  # the shared block is long
    with torch.no_grad():
        for temperature in (1.0, 0.6):
            plain = completion_logprobs(model, pairs, temperature)
            shared = example.shared_prefix_logprobs(model, pairs, temperature)
            for a, b in zip(plain, shared, strict=True):
                assert a.shape == b.shape
                assert float((a - b).abs().max()) < 1e-3
        # the tempered distribution by hand: log_softmax(logits / T) at the reply's tokens
        prompt, reply = pairs[0]
        logits = model(input_ids=torch.tensor([prompt + reply])).logits[0].float()
        rows = (logits[len(prompt) - 1 : -1] / 0.6).log_softmax(-1)
        by_hand = rows.gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)
        assert float((by_hand - shared[0]).abs().max()) < 1e-3
        assert float((by_hand - plain[0]).abs().max()) < 1e-3
