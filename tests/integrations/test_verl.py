"""The verl adapter: our runner inside verl's own ``AgentLoopWorker``, generating through a
``server_manager``, its output padded into a ``DataProto`` by verl's code.

Marked ``trainers``: they need verl (``pip install 'llenvs-async[verl]'``), skipped locally
without it, FAILED in CI. The server manager is a stand-in with verl's contract
(``generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput``) that really
generates: ids of the real tokenizer, chosen from the prompt it was sent.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import (
    Action,
    EnvError,
    LlenvsError,
    SamplingParams,
    ScriptedBackend,
    State,
    StepResult,
    TextProtocol,
    TrajectoryRunner,
)
from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment, load_task
from llenvs_async.envs import ChainEnv
from llenvs_async.integrations.verl import (
    VerlServerBackend,
    load_env_factory,
    to_verl,
)
from llenvs_async.policies import shell_reply

pytestmark = pytest.mark.trainers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"
HARBOR_TASK = "llenvs-examples/organize-files"
SYSTEM = "Walk right."
PROMPT_LENGTH, RESPONSE_LENGTH = 512, 1024


class CrashingChain(ChainEnv):
    """``ChainEnv`` whose second step fails on ``crash`` (a failed rollout with sampled ids)."""

    async def _step(self, state: State, action: Action) -> StepResult:
        if action.text.strip() == "crash" and state.step >= 1:
            raise EnvError("boom")
        return await super()._step(state, action)


async def make_chain_env() -> ChainEnv:
    """Corridors of length 2, 3, 4 (tasks 0-2), 3 steps: what the agent loop entry names."""
    return CrashingChain(min_length=2, num_tasks=3, max_steps=3)


async def make_harbor_env() -> HarborEnvironment:
    return await HarborAdapter().get_environment(EXAMPLES, max_steps=8)


class ScriptedServer:
    """verl's ``server_manager.generate`` contract; ``reply(prompt_text)`` picks the text, the
    tokenizer makes the ids (+ the end-of-turn id); logprobs -0.5, -1.5, ... when asked.
    Records every call."""

    def __init__(self, tokenizer: Any, reply: Callable[[str], str]) -> None:
        from verl.workers.rollout.replica import TokenOutput

        self.tokenizer, self.reply, self.token_output = tokenizer, reply, TokenOutput
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.calls: list[tuple[str, list[int], dict[str, Any], list[int]]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> Any:
        text = self.reply(self.tokenizer.decode(prompt_ids))
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end]
        ids = ids[: sampling_params["max_tokens"]]
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params), ids))
        logprobs = [-0.5 - i for i in range(len(ids))] if sampling_params.get("logprobs") else None
        return self.token_output(
            token_ids=ids, log_probs=logprobs, stop_reason="completed", extra_fields={}
        )

    def by_request(self) -> dict[str, list[tuple[list[int], dict[str, Any], list[int]]]]:
        """Calls per request id: (prompt ids, sampling params, returned ids), in order."""
        out: dict[str, list[tuple[list[int], dict[str, Any], list[int]]]] = {}
        for request_id, prompt, params, ids in self.calls:
            out.setdefault(request_id, []).append((prompt, params, ids))
        return out


def chain_reply(prompt: str) -> str:
    """Corridor 2: ``right`` (reaches the goal); 3: ``left`` (3 steps, no goal); 4: ``right``
    then ``crash`` (the environment fails)."""
    length = int(re.search(r"You are at \d+ of (\d+)", prompt).group(1))  # type: ignore[union-attr]
    if length == 4:
        return "crash" if prompt.count("<|im_start|>assistant") > 1 else "right"
    return {2: "right", 3: "left"}[length]


def solution_reply(prompt: str) -> str:
    """The organize-files solution, one command per turn, then ``SUBMIT``."""
    commands = load_task(EXAMPLES / "organize-files").solution_commands()
    shown = sum(m.role == "assistant" for m in TextProtocol().examples())  # the example turns
    step = prompt.count("<|im_start|>assistant") - 1 - shown
    return shell_reply(commands[step] if step < len(commands) else "SUBMIT")


@pytest.fixture(scope="module", params=["tiny", "smollm2-135m-instruct"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    """The tiny model, and the real one: verl's rows built from each one's tokenizer."""
    if request.param == "tiny":
        from llenvs_async.testing.tiny_model import cached_tiny_model

        return cached_tiny_model()
    pytest.importorskip("gguf")
    from llenvs_async.models import fetch_model

    return fetch_model(request.param)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def verl_config(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Any:
    """verl's own ``ppo_trainer`` config (hydra), with our agent loops registered the way a
    user does it: a YAML file named by ``rollout.agent.agent_loop_config_path``."""
    pytest.importorskip("verl.experimental.agent_loop.agent_loop")
    hydra = pytest.importorskip("hydra")
    import verl.trainer.config

    loops = tmp_path_factory.mktemp("verl") / "agent_loops.yaml"
    target = "llenvs_async.integrations.verl.LlenvsAgentLoop"
    loops.write_text(
        f"- name: llenvs_chain\n  _target_: {target}\n"
        f"  env_factory: tests.integrations.test_verl:make_chain_env\n"
        f"  system_prompt: {SYSTEM}\n  max_tokens_per_turn: 8\n"
        f"- name: llenvs_harbor\n  _target_: {target}\n"
        f"  env_factory: tests.integrations.test_verl:make_harbor_env\n"
    )
    config_dir = str(Path(verl.trainer.config.__file__).parent)
    with hydra.initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra.compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
            ],
        )


def batch_of(agent: str, tasks: list[Any]) -> Any:
    """A verl input batch as its dataset makes it: non-tensor fields per sample."""
    import numpy as np
    from verl.protocol import DataProto

    n = len(tasks)
    column = np.empty(n, dtype=object)
    column[:] = [[{"role": "user", "content": "ignored: the environment sets the prompt"}]] * n
    extra = np.empty(n, dtype=object)
    extra[:] = [{"task": t} for t in tasks]
    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": column,
            "agent_name": np.array([agent] * n, dtype=object),
            "extra_info": extra,
            "index": np.arange(n),
        }
    )


def row(output: Any, i: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """Row i of verl's padded batch without its padding: (prompt, response, mask, logprobs)."""
    batch = output.batch
    prompt_mask = batch["attention_mask"][i, :PROMPT_LENGTH].bool()
    response_mask = batch["attention_mask"][i, PROMPT_LENGTH:].bool()
    prompt = batch["prompts"][i][prompt_mask].tolist()
    response = batch["responses"][i][response_mask].tolist()
    mask = batch["response_mask"][i][response_mask].tolist()
    logprobs = batch["rollout_log_probs"][i][response_mask].tolist()
    return prompt, response, mask, logprobs


def test_verl_worker_runs_our_loop_and_pads_it_into_a_dataproto(
    verl_config: Any, tokenizer: Any
) -> None:
    import asyncio

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    server = ScriptedServer(tokenizer, chain_reply)
    worker = AgentLoopWorker(verl_config, llm_client=server)  # type: ignore[arg-type]
    output = asyncio.run(worker.generate_sequences(batch_of("llenvs_chain", [0, 1, 2])))

    extra = output.non_tensor_batch
    assert list(extra["stop_reason"]) == ["terminated", "truncated", "error"]
    assert list(extra["failed"]) == [False, False, True]
    assert extra["error"][2] == "EnvError: boom"
    assert list(extra["num_steps"]) == [2, 3, 1]
    assert list(extra["__num_turns__"]) == [4, 6, 2]
    # reward_score -> rm_scores on each row's last response token
    rm = output.batch["rm_scores"]
    assert rm.sum(dim=1).tolist() == [1.0, 0.0, 0.0]

    calls = server.by_request()
    assert len(calls) == 3  # one sticky request id per rollout
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for i in range(3):
        prompt, response, mask, logprobs = row(output, i)
        [turns] = [c for c in calls.values() if c[0][0] == prompt]
        if i == 2:  # failed at its second step: the first step's ids kept, none trained on
            assert response == turns[0][2] and set(mask) == {0} and len(turns) == 2
            continue
        # token exact: every prompt sent is the start prompt + the response so far, and
        # after the previous prompt come exactly the ids the server returned for it
        for k, (sent, params, _) in enumerate(turns):
            assert sent == (prompt + response)[: len(sent)]
            assert params["repetition_penalty"] == 1.0  # verl's own keys pass through
            assert params["max_tokens"] <= 8 and params["logprobs"] is True
            if k:
                before, _, returned = turns[k - 1]
                assert sent[len(before) : len(before) + len(returned)] == returned
        sampled = [t for t, m in zip(response, mask, strict=True) if m]
        assert sampled == [t for _, _, ids in turns for t in ids]  # mask 1 = sampled ids
        assert response[-1] == end and mask[-1] == 1
        assert 0 in mask  # observation turns between actions are not trained on
        assert [lp for lp, m in zip(logprobs, mask, strict=True) if m][:2] == [-0.5, -1.5]
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)


def test_response_length_budget_stops_as_context_length(tokenizer: Any) -> None:
    import asyncio

    pytest.importorskip("verl.workers.rollout.replica")
    server = ScriptedServer(tokenizer, lambda prompt: "left")
    budget = 20
    backend = VerlServerBackend(server, tokenizer, response_length=budget)
    runner = TrajectoryRunner(
        ChainEnv(min_length=3, max_steps=50),
        backend,
        SamplingParams(max_tokens=8),
        token_mode=True,
    )
    [trajectory] = asyncio.run(runner.run_batch([0]))
    assert trajectory.error is None and trajectory.stop_reason == "context_length"
    record = trajectory.token_record()
    assert record is not None
    response = len(record.input_ids) - record.prompt_length
    assert 0 < response <= budget
    start = len(server.calls[0][1])
    for _, prompt, params, _ in server.calls:  # each turn asked for at most what was left
        assert params["max_tokens"] == min(8, budget - (len(prompt) - start))
    fields = to_verl(trajectory, pad_token_id=0, response_length=budget)
    assert len(fields["response_ids"]) == response and fields["extra_fields"]["stop_reason"] == (
        "context_length"
    )


def test_failures_policy_and_bad_input_are_clear(tokenizer: Any) -> None:
    import asyncio

    pytest.importorskip("verl.workers.rollout.replica")
    server = ScriptedServer(tokenizer, chain_reply)
    runner = TrajectoryRunner(
        CrashingChain(min_length=2, num_tasks=3, max_steps=3),
        VerlServerBackend(server, tokenizer),
        SamplingParams(max_tokens=8),
        token_mode=True,
    )
    crashed, unknown = asyncio.run(runner.run_batch([2, 7]))
    assert crashed.error is not None and unknown.error is not None
    kept = to_verl(crashed, pad_token_id=0, failures="zero")
    assert 1 in kept["response_mask"] and kept["reward_score"] == 0.0
    assert set(to_verl(crashed, pad_token_id=0)["response_mask"]) == {0}
    # reset failed: no ids at all -> one pad token of response, masked
    empty = to_verl(unknown, pad_token_id=5)
    assert (empty["response_ids"], empty["response_mask"]) == ([5], [0])
    with pytest.raises(LlenvsError, match=r"failures=.raise.*EnvError: boom"):
        to_verl(crashed, pad_token_id=0, failures="raise")
    with pytest.raises(ValueError, match="failures"):
        to_verl(crashed, pad_token_id=0, failures="drop")  # type: ignore[arg-type]
    with pytest.raises(LlenvsError, match="module:attribute"):
        load_env_factory("no_colon_here")
    with pytest.raises(LlenvsError, match="cannot be loaded"):
        load_env_factory("tests.integrations.test_verl:no_such_factory")
    with pytest.raises(TypeError, match="server_manager"):
        VerlServerBackend(object(), tokenizer)


def test_plain_trajectory_is_refused() -> None:
    import asyncio

    runner = TrajectoryRunner(ChainEnv(min_length=1), ScriptedBackend(lambda r: "right"))
    [plain] = asyncio.run(runner.run_batch([0]))
    assert plain.error is None
    with pytest.raises(LlenvsError, match="token mode"):
        to_verl(plain, pad_token_id=0)


def test_task_missing_from_the_sample_names_the_field(verl_config: Any, tokenizer: Any) -> None:
    import asyncio

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = AgentLoopWorker(verl_config, llm_client=ScriptedServer(tokenizer, chain_reply))  # type: ignore[arg-type]
    batch = batch_of("llenvs_chain", [0])
    del batch.non_tensor_batch["extra_info"]
    with pytest.raises(LlenvsError, match="no 'task' field"):
        asyncio.run(worker.generate_sequences(batch))


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_harbor_task_in_a_container_through_verl(
    verl_config: Any, tokenizer: Any, no_containers_left: None
) -> None:
    import asyncio

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    server = ScriptedServer(tokenizer, solution_reply)
    worker = AgentLoopWorker(verl_config, llm_client=server)  # type: ignore[arg-type]
    output = asyncio.run(worker.generate_sequences(batch_of("llenvs_harbor", [HARBOR_TASK])))
    extra = output.non_tensor_batch
    assert extra["error"][0] is None and extra["stop_reason"][0] == "terminated"
    assert output.batch["rm_scores"].sum().item() == 1.0  # the task's verifier passed
    commands = load_task(EXAMPLES / "organize-files").solution_commands()
    assert extra["num_steps"][0] == len(commands) + 1  # the commands, then SUBMIT
    _, response, mask, _ = row(output, 0)
    assert 0 in mask and 1 in mask and len(response) <= RESPONSE_LENGTH


def test_importing_the_adapter_does_not_import_verl() -> None:
    code = (
        "import sys, llenvs_async.integrations.verl as v; print('verl' in sys.modules)\n"
        "sys.modules['verl'] = None\n"
        "try:\n    v.LlenvsAgentLoop\nexcept v.VerlUnavailableError as e:\n"
        "    print(isinstance(e, ImportError), 'llenvs-async[verl]' in str(e))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.stdout.split() == ["False", "True", "True"], done.stderr
