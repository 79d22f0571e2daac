"""TRL's ``GRPOTrainer`` trained on our runner's rollouts of a Harbor task in real containers
(``rollout_func``): the weights move, the rewards are the task verifier's, and no container
is left, also when a rollout raises in the middle of a training step.

Needs TRL (the ``trainers`` tier), a Docker engine and the base image (``make images``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import (
    Completion,
    GenerationRequest,
    SamplingParams,
    ScriptedBackend,
    TrajectoryRunner,
)
from llenvs_async._ownership import OWNER_LABEL
from llenvs_async.adapters.harbor import HarborAdapter, load_task
from llenvs_async.adapters.harbor.images.image import TASK_IMAGE_LABEL
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.integrations.trl import environment_reward, rollout_func
from llenvs_async.policies import shell_reply

from .conftest import cpu_grpo_config

pytestmark = [pytest.mark.trainers, pytest.mark.docker]

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASK = "csv-totals"


def task_containers() -> list[str]:
    """Ids of this process's Harbor task containers (asked from a thread of its own, so it
    also works from inside a running event loop)."""

    async def ask() -> list[str]:
        async with DockerEngine() as engine:
            found = await engine.list_containers(
                {OWNER_LABEL: engine.labels[OWNER_LABEL], TASK_IMAGE_LABEL: None}
            )
        return [str(c["Id"]) for c in found]

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, ask()).result()


class SolutionPolicy:
    """Even rollouts run the task's solution then submit (the verifier passes), odd ones
    submit at once (it fails); every reply is tokenized with the trainer's tokenizer.
    ``explode`` makes a call raise a programming error (which the runner propagates, unlike
    a rollout's failure, which is data): a crash in the middle of a training step."""

    def __init__(self, tokenizer: Any, commands: tuple[str, ...]) -> None:
        self.tokenizer, self.commands = tokenizer, commands
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.explode: Callable[[GenerationRequest], bool] = lambda request: False

    def __call__(self, request: GenerationRequest) -> Completion:
        if self.explode(request):
            raise TypeError("the trainer's process failed mid-step")
        solving = request.rollout_index % 2 == 0 and request.step < len(self.commands)
        text = shell_reply(self.commands[request.step] if solving else "SUBMIT")
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end]
        return Completion(
            text=text,
            token_ids=tuple(ids),
            logprobs=tuple(-1.0 for _ in ids),
            finish_reason="stop",
            prompt_token_ids=request.prompt_token_ids or (),
        )


@pytest.mark.timeout(300)
def test_grpo_trains_on_harbor_rollouts_in_containers_and_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker_images: None
) -> None:
    trl = pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    for name in ("TRL_EXPERIMENTAL_SILENCE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    from llenvs_async.testing.tiny_model import cached_tiny_model

    model_dir = cached_tiny_model()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    policy = SolutionPolicy(tokenizer, load_task(TASKS / TASK).solution_commands())
    live: list[int] = []  # containers of ours while each batch's rollouts run

    @contextlib.asynccontextmanager
    async def make_runner() -> AsyncIterator[TrajectoryRunner]:
        async with HarborAdapter(cache_dir=tmp_path / "cache") as adapter:

            async def env_factory() -> Any:
                return await adapter.get_environment(TASKS, max_steps=6)

            async with (
                await env_factory() as env,
                ScriptedBackend(policy, tokenizer=tokenizer) as b,
            ):
                yield TrajectoryRunner(
                    env,
                    b,
                    SamplingParams(max_tokens=64),
                    env_factory=env_factory,
                    token_mode=True,
                    chat_template_kwargs={"enable_thinking": False},
                )

    def count_live(request: GenerationRequest) -> bool:
        if request.step == 1 and request.rollout_index == 0:
            live.append(len(task_containers()))
        return False

    policy.explode = count_live

    def config(steps: int) -> Any:
        return cpu_grpo_config(tmp_path / "out", max_steps=steps, learning_rate=1e-2)

    dataset = datasets.Dataset.from_dict({"prompt": [TASK] * 4})
    with rollout_func(make_runner) as rollouts:
        batches: list[list[Any]] = []

        def recorded(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
            out = rollouts(prompts, trainer)
            batches.append(rollouts.last_trajectories)
            return out

        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=environment_reward,
            args=config(2),
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=recorded,
        )
        trainer.train()

        # a second run whose second batch raises while its containers are up
        policy.explode = lambda request: request.step == 2 and len(batches) == 3
        crashing = trl.GRPOTrainer(
            model=model,
            reward_funcs=environment_reward,
            args=config(2),
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=recorded,
        )
        with pytest.raises(TypeError, match="failed mid-step"):
            crashing.train()
        assert task_containers() == []  # the runner tore the batch down
    assert task_containers() == []

    # One container per rollout: at rollout 0's second step its solving sibling is still up,
    # the two that submitted at once may already be closed; never more than the batch's 4.
    assert trainer.state.global_step == 2 and len(live) == 2
    assert all(2 <= n <= 4 for n in live), live
    changed = [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter moved: the optimizer steps did not use our rollouts"
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(logs) == 2
    for entry, trajectories in zip(logs, batches[:2], strict=True):
        # the rewards are the verifier's (0.0 on every step but the verified submit): the
        # solved half passed, the rest failed
        assert [t.total_reward for t in trajectories] == [1.0, 0.0, 1.0, 0.0]
        assert all(t.transitions[-1].next_state.terminated for t in trajectories)
        assert entry["rewards/environment_reward/mean"] == pytest.approx(0.5)
