"""The TRL adapter: our runner's token-mode rollouts as TRL ``rollout_func`` output.

Tests marked ``trainers`` need the real TRL package (``pip install 'llenvs-async[trl]'``):
skipped locally without it, FAILED in CI. The others exercise the conversion and the
sync/async bridge without TRL: the adapter imports TRL only in ``rollout_func``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import (
    Action,
    ClosedError,
    Completion,
    EnvError,
    GenerationRequest,
    LlenvsError,
    SamplingParams,
    ScriptedBackend,
    State,
    StepResult,
    Trajectory,
    TrajectoryRunner,
)
from llenvs_async.envs import ChainEnv
from llenvs_async.integrations.trl import (
    TRLRollouts,
    TRLUnavailableError,
    environment_reward,
    rollout_func,
    to_trl,
)
from llenvs_async.testing.chat_tokenizer import IM_END, ChatMLTokenizer
from tests._support import run_child

from .conftest import cpu_grpo_config

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "Walk right."
LOOP_THREAD = "llenvs-trl-rollouts"


class CrashingChain(ChainEnv):
    """``ChainEnv`` whose second step fails on the action ``crash`` (a failed rollout that
    sampled ids before it failed)."""

    async def _step(self, state: State, action: Action) -> StepResult:
        if action.text == "crash" and state.step >= 1:
            raise EnvError("boom")
        return await super()._step(state, action)


class WordPolicy:
    """Rollout i says ``words[i % len(words)]`` every step, one id per character (+ the stop
    token), with logprobs -0.5, -1.5, ...; records every request."""

    def __init__(self, encode: Callable[[str], list[int]], end: int, *words: str) -> None:
        self.encode, self.end, self.words = encode, end, words
        self.requests: list[GenerationRequest] = []

    def __call__(self, request: GenerationRequest) -> Completion:
        self.requests.append(request)
        text = self.words[request.rollout_index % len(self.words)]
        ids = [*self.encode(text), self.end]
        return Completion(
            text=text,
            token_ids=tuple(ids),
            logprobs=tuple(-0.5 - i for i in range(len(ids))),
            finish_reason="stop",
            prompt_token_ids=request.prompt_token_ids or (),
        )

    def of(self, rollout: int) -> list[GenerationRequest]:
        return [r for r in self.requests if r.rollout_index == rollout]


def chain_runner(
    policy: WordPolicy, tokenizer: Any, *, env_max_steps: int = 2, **kwargs: Any
) -> TrajectoryRunner:
    """Corridors of length 2 (task 0) and 3 (task 1), ``env_max_steps`` steps."""
    return TrajectoryRunner(
        CrashingChain(min_length=2, num_tasks=2, max_steps=env_max_steps),
        ScriptedBackend(policy, tokenizer=tokenizer),
        SamplingParams(max_tokens=8),
        system_prompt=SYSTEM,
        token_mode=True,
        **kwargs,
    )


@pytest.fixture
def tok() -> ChatMLTokenizer:
    return ChatMLTokenizer()


def thread_alive() -> bool:
    return any(t.name == LOOP_THREAD for t in threading.enumerate())


# -- the dict TRL gets ------------------------------------------------------------------


@pytest.mark.trainers
def test_multi_step_rollout_becomes_trl_dict_with_env_tokens_masked(tok: ChatMLTokenizer) -> None:
    pytest.importorskip("trl")
    policy = WordPolicy(tok.char_ids, IM_END, "right", "left")
    with rollout_func(chain_runner(policy, tok)) as rollouts:
        out = rollouts(["0", "0"], None)  # what TRL passes: one group of num_generations=2
        trajectories = rollouts.last_trajectories
    assert set(out) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask", "reward"}
    assert all(isinstance(v, list) and len(v) == 2 for v in out.values())
    assert out["reward"] == [1.0, 0.0] and out["total_reward"] == [1.0, 0.0]
    assert out["stop_reason"] == ["terminated", "truncated"]
    assert out["failed"] == [False, False] and out["num_steps"] == [2, 2]
    assert out["error"] == [None, None]
    for row in range(2):
        first, second = policy.of(row)  # two turns: action, observation turn, action
        p0, p1 = first.prompt_token_ids, second.prompt_token_ids
        assert p0 is not None and p1 is not None
        word = "right" if row == 0 else "left"
        action = [*tok.char_ids(word), IM_END]
        observation = list(p1[len(p0) + len(action) :])
        assert list(p1[: len(p0) + len(action)]) == [*p0, *action]  # the extension property
        assert out["prompt_ids"][row] == list(p0)
        assert out["completion_ids"][row] == [*action, *observation, *action]
        # env_mask is 0 exactly on the environment's turn, which carries its observation
        assert out["env_mask"][row] == [1] * len(action) + [0] * len(observation) + [1] * len(
            action
        )
        position = 1 if word == "right" else 0
        assert f"You are at {position} of 2." in tok.decode(observation)
        lps = [-0.5 - i for i in range(len(action))]
        assert out["logprobs"][row] == [*lps, *[0.0] * len(observation), *lps]
        record = trajectories[row].token_record()
        assert record is not None
        assert out["prompt_ids"][row] + out["completion_ids"][row] == list(record.input_ids)


def test_failed_rollouts_are_kept_per_failures_policy(tok: ChatMLTokenizer) -> None:
    policy = WordPolicy(tok.char_ids, IM_END, "right", "crash")
    runner = chain_runner(policy, tok)
    with TRLRollouts(runner, failures="exclude") as rollouts:
        out = rollouts(["0", "0", "99"], None)  # "99": reset fails (unknown task)
        trajectories = rollouts.last_trajectories
    assert len(out["prompt_ids"]) == 3  # never dropped: TRL needs one entry per prompt
    assert out["failed"] == [False, True, True]
    assert out["reward"] == [1.0, None, None]  # None: TRL leaves it out of the baseline
    assert out["error"][0] is None and out["error"][1] == "EnvError: boom"
    assert out["error"][2].startswith("EnvError: unknown task")
    assert sum(out["env_mask"][0]) > 0
    assert out["env_mask"][1] == [0] * len(out["completion_ids"][1])  # nothing trained on
    assert len(out["completion_ids"][1]) > 1  # its sampled ids are kept, masked
    # a rollout with no ids at all: one pad token of prompt and of completion, masked
    assert (out["prompt_ids"][2], out["completion_ids"][2]) == ([0], [0])
    assert (out["env_mask"][2], out["logprobs"][2]) == ([0], [0.0])

    zero = to_trl(trajectories, pad_token_id=7, failures="zero")
    assert zero["reward"] == [1.0, 0.0, 0.0]
    record = trajectories[1].token_record()
    assert record is not None
    assert zero["env_mask"][1] == list(record.loss_mask[record.prompt_length :])
    assert sum(zero["env_mask"][1]) > 0
    assert zero["prompt_ids"][2] == [7] and zero["completion_ids"][2] == [7]

    with pytest.raises(LlenvsError, match=r"rollout 1 failed .*EnvError: boom"):
        to_trl(trajectories, pad_token_id=0, failures="raise")
    with TRLRollouts(runner, failures="raise") as strict, pytest.raises(LlenvsError):
        strict(["0", "0"], None)


def test_environment_reward_returns_the_column_and_logs_failures() -> None:
    logged: list[tuple[str, float]] = []
    rewards = environment_reward(
        reward=[1.0, None, 0.0, 0.5],
        failed=[False, True, False, False],
        log_metric=lambda name, value: logged.append((name, value)),
        prompts=["0"] * 4,
        completions=["x"] * 4,
    )
    assert rewards == [1.0, None, 0.0, 0.5]
    assert logged == [("llenvs/failed", 0.25)]
    with pytest.raises(LlenvsError, match="rollout_func"):
        environment_reward(prompts=["0"], completions=["x"])


def test_missing_logprobs_are_nan_on_sampled_ids_only(tok: ChatMLTokenizer) -> None:
    def policy(request: GenerationRequest) -> Completion:
        return Completion(
            text="right",
            token_ids=(*tok.char_ids("right"), IM_END),
            finish_reason="stop",
            prompt_token_ids=request.prompt_token_ids or (),
        )

    runner = TrajectoryRunner(
        ChainEnv(min_length=2, max_steps=2),
        ScriptedBackend(policy, tokenizer=tok),
        system_prompt=SYSTEM,
        token_mode=True,
    )
    with TRLRollouts(runner) as rollouts:
        out = rollouts(["0"], None)
    [mask], [logprobs] = out["env_mask"], out["logprobs"]
    assert 0 in mask and len(logprobs) == len(mask)
    assert all(math.isnan(lp) if m else lp == 0.0 for m, lp in zip(mask, logprobs, strict=True))


def test_plain_runner_and_prompt_mapping_are_checked(tok: ChatMLTokenizer) -> None:
    policy = WordPolicy(tok.char_ids, IM_END, "right")
    plain = TrajectoryRunner(
        ChainEnv(min_length=2), ScriptedBackend(lambda r: "right"), system_prompt=SYSTEM
    )
    with TRLRollouts(plain) as rollouts, pytest.raises(LlenvsError, match="token_mode=True"):
        rollouts(["0"], None)
    conversational = [[{"role": "user", "content": "1"}]]
    with TRLRollouts(chain_runner(policy, tok)) as rollouts, pytest.raises(TypeError, match="task"):
        rollouts(conversational, None)
    mapped = TRLRollouts(chain_runner(policy, tok), task_of=lambda p: p[-1]["content"])
    with mapped:
        out = mapped(conversational, None)
    assert len(out["prompt_ids"]) == 1 and mapped.last_trajectories[0].initial_state.task == 1
    with pytest.raises(ValueError, match="failures"):
        TRLRollouts(plain, failures="drop")  # type: ignore[arg-type]


# -- sync/async bridge and teardown -----------------------------------------------------


def test_factory_runs_on_the_adapter_loop_and_close_exits_it(tok: ChatMLTokenizer) -> None:
    events: list[tuple[str, str]] = []
    policy = WordPolicy(tok.char_ids, IM_END, "right")

    @contextlib.asynccontextmanager
    async def make() -> AsyncIterator[TrajectoryRunner]:
        events.append(("enter", threading.current_thread().name))
        backend = ScriptedBackend(policy, tokenizer=tok)
        async with backend:
            try:
                yield chain_runner(policy, tok)
            finally:
                events.append(("exit", threading.current_thread().name))

    rollouts = TRLRollouts(make)
    assert thread_alive()
    rollouts(["0"], None)
    rollouts(["1"], None)
    assert events == [("enter", LOOP_THREAD)]  # entered once, on the adapter's loop
    rollouts.close()
    assert events == [("enter", LOOP_THREAD), ("exit", LOOP_THREAD)]
    assert rollouts.closed and not thread_alive()
    rollouts.close()  # idempotent
    with pytest.raises(ClosedError):
        rollouts(["0"], None)
    with pytest.raises(ClosedError):
        rollouts.__enter__()


def test_dropped_adapter_is_closed_by_its_finalizer(tok: ChatMLTokenizer) -> None:
    exited = threading.Event()
    policy = WordPolicy(tok.char_ids, IM_END, "right")

    @contextlib.asynccontextmanager
    async def make() -> AsyncIterator[TrajectoryRunner]:
        try:
            yield chain_runner(policy, tok)
        finally:
            exited.set()

    rollouts = TRLRollouts(make)
    rollouts(["0"], None)
    del rollouts  # what happens when TRL's trainer (its only holder) goes away
    gc.collect()
    assert exited.is_set() and not thread_alive()


def test_weights_are_pushed_when_the_trainer_stepped(tok: ChatMLTokenizer) -> None:
    class Model:
        def named_parameters(self) -> list[tuple[str, Any]]:
            return [("w", 0.0)]

    class Accelerator:
        def unwrap_model(self, model: Any) -> Any:
            return model

    class Trainer:  # the attributes of GRPOTrainer the adapter reads
        def __init__(self, step: int, use_vllm: bool = False) -> None:
            self.state = type("State", (), {"global_step": step})()
            self.args = type("Args", (), {"use_vllm": use_vllm})()
            self.accelerator, self.model = Accelerator(), Model()
            self.processing_class = tok

    policy = WordPolicy(tok.char_ids, IM_END, "right")
    runner = chain_runner(policy, tok)
    backend = runner.backend
    assert isinstance(backend, ScriptedBackend)
    with TRLRollouts(runner) as rollouts:
        rollouts(["0"], Trainer(0))  # version 0 = the checkpoint: nothing to push
        rollouts(["0"], Trainer(1))
        rollouts(["0"], Trainer(1))
        rollouts(["0"], Trainer(2, use_vllm=True))  # TRL syncs its own vLLM
        assert backend.weight_updates == [(1, "wait")] and rollouts.weight_updates == 1
        assert rollouts.last_trajectories[0].policy_versions == (1,)
    with TRLRollouts(runner, sync_weights=False) as rollouts:
        rollouts(["0"], Trainer(5))
    assert backend.weight_updates == [(1, "wait")]


def test_missing_trl_names_the_extra(monkeypatch: pytest.MonkeyPatch, tok: ChatMLTokenizer) -> None:
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl -> ImportError
    runner = chain_runner(WordPolicy(tok.char_ids, IM_END, "right"), tok)
    with pytest.raises(TRLUnavailableError, match=r"pip install 'llenvs-async\[trl\]'") as info:
        rollout_func(runner)
    assert isinstance(info.value, ImportError) and isinstance(info.value, LlenvsError)
    assert not thread_alive()


CHILD_PRELUDE = """
import contextlib, sys, threading
from llenvs_async import Completion, ScriptedBackend, TrajectoryRunner
from llenvs_async.envs import ChainEnv, CounterEnv, InstanceTracker
from llenvs_async.integrations.trl import TRLRollouts
from llenvs_async.testing.chat_tokenizer import IM_END, ChatMLTokenizer

tok = ChatMLTokenizer()

def policy(request):
    if request.step == 2:
        print("RUNNING", flush=True)
    ids = (*tok.char_ids("inc"), IM_END)
    return Completion(text="inc", token_ids=ids, finish_reason="stop",
                      prompt_token_ids=request.prompt_token_ids or ())
"""

SIGINT_CHILD = CHILD_PRELUDE + textwrap.dedent(
    """
    tracker = InstanceTracker()

    async def factory():
        return CounterEnv(tracker=tracker, latency=0.05)

    runner = TrajectoryRunner(CounterEnv(), ScriptedBackend(policy, tokenizer=tok),
                              env_factory=factory, token_mode=True)
    rollouts = TRLRollouts(runner)
    try:
        rollouts([10**6] * 8, None)  # called from the main thread, as TRL's loop does
    except KeyboardInterrupt:
        print(f"INTERRUPTED created={tracker.created} live={tracker.live}", flush=True)
    out = rollouts([1, 1], None)
    print(f"AGAIN rows={len(out['prompt_ids'])} live={tracker.live}", flush=True)
    rollouts.close()
    alive = any(t.name == "llenvs-trl-rollouts" for t in threading.enumerate())
    print(f"CLOSED thread={alive}", flush=True)
    """
)

ATEXIT_CHILD = CHILD_PRELUDE + textwrap.dedent(
    """
    @contextlib.asynccontextmanager
    async def make():
        async with ScriptedBackend(policy, tokenizer=tok) as backend:
            try:
                yield TrajectoryRunner(ChainEnv(), backend, token_mode=True, max_steps=2)
            finally:
                print(f"EXIT {threading.current_thread().name}", flush=True)

    rollouts = TRLRollouts(make)
    print(f"CALLED rows={len(rollouts(['0', '1'], None)['prompt_ids'])}", flush=True)
    # no close(): the process ends with the adapter still referenced
    """
)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}


@pytest.mark.timeout(120)
def test_ctrl_c_during_a_call_tears_the_batch_down_and_the_adapter_goes_on() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGINT_CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "RUNNING"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "INTERRUPTED created=8 live=0" in out, (out, err)
    assert "AGAIN rows=2 live=0" in out, (out, err)
    assert "CLOSED thread=False" in out, (out, err)


@pytest.mark.timeout(120)
def test_adapter_left_open_is_closed_at_interpreter_exit() -> None:
    done = run_child([sys.executable, "-c", ATEXIT_CHILD], timeout=60, env=child_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["CALLED rows=2", f"EXIT {LOOP_THREAD}"], done.stderr


def test_importing_the_adapter_does_not_import_trl() -> None:
    code = "import sys, llenvs_async.integrations.trl; print('trl' in sys.modules)"
    done = run_child([sys.executable, "-c", code], timeout=60, env=child_env())
    assert done.stdout.strip() == "False", done.stderr


# -- a real GRPOTrainer -----------------------------------------------------------------


@pytest.mark.trainers
@pytest.mark.timeout(240)
def test_grpo_trainer_takes_optimizer_steps_on_our_rollouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trl = pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    for name, value in {
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }.items():
        monkeypatch.setenv(name, value)

    from llenvs_async.testing.tiny_model import cached_tiny_model

    model_dir = cached_tiny_model()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    # per group of 4, on either task: success (1.0), failure (0.0), success, a failed
    # rollout (excluded)
    policy = WordPolicy(encode, end, "right", "left", "right", "crash")
    runner = chain_runner(
        policy, tokenizer, env_max_steps=3, chat_template_kwargs={"enable_thinking": False}
    )
    backend = runner.backend
    assert isinstance(backend, ScriptedBackend)
    calls: list[tuple[list[Any], dict[str, list[Any]], list[Trajectory]]] = []
    config = cpu_grpo_config(tmp_path, max_steps=2, learning_rate=1e-2)
    with rollout_func(runner) as rollouts:

        def recorded(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
            out = rollouts(prompts, trainer)
            calls.append((list(prompts), out, rollouts.last_trajectories))
            return out

        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=environment_reward,
            args=config,
            train_dataset=datasets.Dataset.from_dict({"prompt": ["0", "1"]}),
            processing_class=tokenizer,
            rollout_func=recorded,
        )
        trainer.train()
        last = rollouts.last_trajectories

    assert trainer.state.global_step == 2 and len(calls) == 2
    for prompts, out, _ in calls:  # TRL 1.16 passes each prompt num_generations times
        assert len(prompts) == 4 and prompts == [prompts[0]] * 4
        assert out["failed"] == [False, False, False, True]
    changed = [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter moved: the optimizer step did not use our rollouts"

    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(logs) == 2
    for entry, (_, out, trajectories) in zip(logs, calls, strict=True):
        # the trainer saw our rewards: the failed rollout left out of the mean
        assert entry["rewards/environment_reward/mean"] == pytest.approx(2 / 3)
        assert entry["llenvs/failed"] == pytest.approx(0.25)
        # TRL counted as a completion's length only the ids the model sampled (env_mask=1):
        # not the observation turns between them, nor anything of the excluded failure
        sampled = [
            0 if t.error else sum(len(s.tokens.action_ids) for s in t.transitions if s.tokens)
            for t in trajectories
        ]
        assert entry["completions/mean_length"] == pytest.approx(sum(sampled) / 4)
        assert sum(sampled) < sum(len(ids) for ids in out["completion_ids"])
    # before the second batch the trainer's step-1 weights went to the backend
    assert backend.weight_updates == [(1, "wait")]
    assert all(t.policy_versions == (1,) for t in last[:3])
