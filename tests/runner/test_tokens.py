"""Token mode: prompts kept as token ids, extended by exact deltas, restorable, recorded."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llenvs_async import (
    Action,
    Completion,
    GenerationRequest,
    Observation,
    OpenAIBackend,
    SamplingParams,
    ScriptedBackend,
    State,
    TokenStep,
    Trajectory,
    TrajectoryRunner,
)
from llenvs_async.envs import ChainEnv, CounterEnv
from llenvs_async.serialization import (
    JsonlWriter,
    StepJournal,
    from_dict,
    read_journal,
    read_trajectories,
    to_dict,
)
from llenvs_async.testing.chat_tokenizer import IM_END, ChatMLTokenizer
from llenvs_async.types import ActionPath

SYSTEM = "Walk right."


class TokenPolicy:
    """Answers ``text`` as one id per character (+ the stop token), recording every request."""

    def __init__(self, tok: ChatMLTokenizer, text: str = "right", *, stop: bool = True) -> None:
        self.tok, self.text, self.stop = tok, text, stop
        self.requests: list[GenerationRequest] = []

    def __call__(self, request: GenerationRequest) -> Completion:
        self.requests.append(request)
        ids = [*self.tok.char_ids(self.text), *([IM_END] if self.stop else [])]
        return Completion(
            text=self.text,
            token_ids=tuple(ids),
            logprobs=tuple(-0.5 - i for i in range(len(ids))),
            finish_reason="stop" if self.stop else "length",
            prompt_token_ids=request.prompt_token_ids or (),
        )

    def by_rollout(self, index: int) -> list[GenerationRequest]:
        return [r for r in self.requests if r.rollout_index == index]


@pytest.fixture
def tok() -> ChatMLTokenizer:
    return ChatMLTokenizer()


def make_runner(
    policy: Callable[[GenerationRequest], Any], tok: Any, **kwargs: Any
) -> TrajectoryRunner:
    env = kwargs.pop("environment", None) or ChainEnv(max_steps=10)
    return TrajectoryRunner(
        env,
        ScriptedBackend(policy, tokenizer=tok),
        SamplingParams(max_tokens=8),
        system_prompt=SYSTEM,
        token_mode=True,
        **kwargs,
    )


def assert_token_exact(traj: Trajectory, requests: list[GenerationRequest]) -> None:
    """The extension property and the record's alignment, turn by turn."""
    record = traj.token_record()
    assert record is not None
    sampled = [t.completion for t in traj.transitions]
    assert len(requests) == len(traj.transitions)
    for t in range(len(requests) - 1):
        prompt, following = requests[t].prompt_token_ids, requests[t + 1].prompt_token_ids
        assert prompt is not None and following is not None
        completion = sampled[t]
        assert completion is not None
        assert following[: len(prompt) + len(completion.token_ids)] == (
            prompt + completion.token_ids
        )
    for t, request in enumerate(requests):
        prompt = request.prompt_token_ids
        assert prompt is not None
        assert record.input_ids[: len(prompt)] == prompt
        assert record.turns[t][0] == len(prompt)
    masked = [i for i, m in enumerate(record.loss_mask) if m]
    sampled_ids = [i for c in sampled if c is not None for i in c.token_ids]
    assert [record.input_ids[i] for i in masked] == sampled_ids
    assert record.logprobs is not None and len(record.logprobs) == sum(record.loss_mask)
    assert list(record.logprobs) == [
        lp for c in sampled if c is not None for lp in c.logprobs or ()
    ]
    assert len(record.input_ids) == len(record.loss_mask)


async def test_prompts_extend_by_sampled_ids_and_observation_turns(tok: ChatMLTokenizer) -> None:
    policy = TokenPolicy(tok)
    [traj] = await make_runner(policy, tok).run_batch([2])
    assert traj.error is None and len(traj) == 5 and traj.stop_reason == "terminated"
    requests = policy.by_rollout(0)
    assert_token_exact(traj, requests)
    first = requests[0].prompt_token_ids
    assert first is not None
    assert tok.decode(first) == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
        f"{traj.initial_state.observation.text}<|im_end|>\n<|im_start|>assistant\n"
    )
    # The observation turn after a sampled stop token: the template's newline, the user turn.
    step = traj.transitions[0].tokens
    assert step is not None and step.sampled
    assert tok.decode(step.observation_ids) == (
        f"\n<|im_start|>user\n{traj.transitions[0].next_state.observation.text}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_re_templating_would_not_extend_the_prompt(tok: ChatMLTokenizer) -> None:
    """What token mode avoids: the sampled ``r i g h t`` re-encode as one merged id."""
    policy = TokenPolicy(tok)
    [traj] = await make_runner(policy, tok).run_batch([1])
    second = policy.by_rollout(0)[1].prompt_token_ids
    from llenvs_async.runner._rollout import conversation

    messages = [{"role": "system", "content": SYSTEM}] + [
        {"role": m.role, "content": m.content} for m in conversation(traj.transitions[0].next_state)
    ]
    retemplated = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert tok.decode(retemplated) == tok.decode(second or ())  # same text...
    assert tuple(retemplated) != second  # ...different ids: the trainer would see drift


async def test_a_completion_cut_before_its_stop_token_gets_the_end_of_turn(
    tok: ChatMLTokenizer,
) -> None:
    policy = TokenPolicy(tok, stop=False)
    [traj] = await make_runner(policy, tok).run_batch([0])
    step = traj.transitions[0].tokens
    assert step is not None
    assert step.observation_ids[:2] == (IM_END, tok.encode("\n")[0])
    assert_token_exact(traj, policy.by_rollout(0))


async def test_forced_action_is_an_assistant_turn_with_mask_zero(tok: ChatMLTokenizer) -> None:
    policy = TokenPolicy(tok)
    runner = make_runner(policy, tok)
    [start] = await runner.run_batch([2], max_steps=1)
    state = start.final_state
    [traj] = await runner.run_batch_from_state_actions([state], ["right"])
    record = traj.token_record()
    assert record is not None
    forced = traj.transitions[0].tokens
    assert forced is not None and not forced.sampled
    assert forced.action_ids == tuple(tok.encode("right<|im_end|>\n", add_special_tokens=False))
    start_, end = record.turns[0]
    assert record.loss_mask[start_:end] == (0,) * (end - start_)
    assert sum(record.loss_mask) == sum(
        len(t.completion.token_ids) for t in traj.transitions[1:] if t.completion
    )
    # The forced turn already closed itself: no second end-of-turn before the user turn.
    assert tok.decode(forced.observation_ids).startswith("<|im_start|>user\n")
    assert record.prompt_length == len(start.transitions[0].state.actions.token_prefix() or ()) + (
        len(start.transitions[0].tokens.action_ids + start.transitions[0].tokens.observation_ids)  # type: ignore[union-attr]
    )


async def test_restored_state_sends_the_original_turn_prompt(tok: ChatMLTokenizer) -> None:
    policy = TokenPolicy(tok)
    runner = make_runner(policy, tok)
    [traj] = await runner.run_batch([3])
    original = policy.by_rollout(0)
    saved = traj.states[3]
    policy.requests.clear()
    [again] = await runner.run_batch_from_states([saved])
    assert policy.requests[0].prompt_token_ids == original[3].prompt_token_ids
    assert again.token_record() is not None
    assert again.token_record().prompt_length == len(original[3].prompt_token_ids or ())  # type: ignore[union-attr]


async def test_restored_state_keeps_its_prefix_through_jsonl(
    tok: ChatMLTokenizer, tmp_path: Path
) -> None:
    policy = TokenPolicy(tok)
    runner = make_runner(policy, tok)
    [traj] = await runner.run_batch([3])
    path = tmp_path / "runs.jsonl"
    with JsonlWriter(path) as writer:
        writer.write_trajectory(traj)
    [back] = read_trajectories(path)
    assert back == traj
    assert back.token_record() == traj.token_record()
    assert [t.tokens for t in back.transitions] == [t.tokens for t in traj.transitions]
    original = policy.by_rollout(0)
    policy.requests.clear()
    await runner.run_batch_from_states([back.states[3]])
    assert policy.requests[0].prompt_token_ids == original[3].prompt_token_ids
    state = from_dict(State, json.loads(json.dumps(to_dict(traj.states[2]))))
    assert state.actions.token_prefix() == original[2].prompt_token_ids  # type: ignore[attr-defined]
    # The record is in the JSONL as plain arrays, for readers that are not this package.
    data = json.loads(path.read_text())["trajectory"]
    assert data["tokens"]["input_ids"] == list(traj.token_record().input_ids)  # type: ignore[union-attr]
    # Each completion's prompt ids are its state's token prefix: written once, not per step.
    assert all(t["completion"]["prompt_token_ids"] == "prefix" for t in data["transitions"])
    assert [t.completion.prompt_token_ids for t in back.transitions] == [  # type: ignore[union-attr]
        r.prompt_token_ids for r in original
    ]
    continued = await runner.run_batch_from_states([back.states[2]])
    with JsonlWriter(path) as writer:
        writer.write_trajectory(continued[0])
    [_, cont_back] = read_trajectories(path)  # a start state's history keeps prefix markers too
    assert cont_back == continued[0]
    assert cont_back.initial_state.history[1].completion == traj.transitions[1].completion


async def test_states_share_token_nodes(tok: ChatMLTokenizer) -> None:
    """O(1) per step: each history node holds only its delta, shared with its successors."""
    policy = TokenPolicy(tok)
    [traj] = await make_runner(policy, tok).run_batch([3])
    for t in traj.transitions:
        node = t.next_state.actions
        assert isinstance(node, ActionPath)
        assert node.tokens is t.tokens
        assert t.next_state.history.extends(t.state.history)
    assert traj.initial_state.actions.token_prefix() == policy.by_rollout(0)[0].prompt_token_ids  # type: ignore[attr-defined]


async def test_prompt_for_a_state_without_token_ids_is_templated_once(tok: ChatMLTokenizer) -> None:
    """A state from a plain run (no ids) starts from its conversation, templated once."""
    plain = TrajectoryRunner(ChainEnv(), ScriptedBackend(lambda r: "right"), system_prompt=SYSTEM)
    [traj] = await plain.run_batch([3], max_steps=2)
    policy = TokenPolicy(tok)
    runner = make_runner(policy, tok)
    renders = tok.renders
    [cont] = await runner.run_batch_from_states([traj.final_state])
    assert cont.error is None and len(cont) == 4
    first = policy.requests[0].prompt_token_ids
    assert first is not None and tok.decode(first).count("<|im_start|>user") == 3
    # one whole-conversation render, then one small render per observation turn
    assert tok.renders - renders == 1 + len(cont) + 1  # +1: the frame, built once per runner
    assert_token_exact(cont, policy.requests)


async def test_chat_template_kwargs_pass_through(tok: ChatMLTokenizer) -> None:
    policy = TokenPolicy(tok)
    runner = make_runner(policy, tok, chat_template_kwargs={"enable_thinking": False})
    [traj] = await runner.run_batch([0])
    for request in policy.requests:
        assert tok.decode(request.prompt_token_ids or ()).endswith(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )
    assert_token_exact(traj, policy.requests)


async def test_non_pure_restore_keeps_the_saved_prefix(tok: ChatMLTokenizer) -> None:
    """Replay restore in a fresh instance: the continuation sends the saved prompt."""
    requests: list[GenerationRequest] = []

    def policy(request: GenerationRequest) -> Completion:
        requests.append(request)
        text = "inc" if request.step < 3 else "submit"
        return Completion(text=text, token_ids=(*tok.char_ids(text), IM_END), logprobs=None)

    async def factory() -> CounterEnv:
        return CounterEnv()

    runner = make_runner(policy, tok, environment=CounterEnv(), env_factory=factory)
    [traj] = await runner.run_batch([3])
    assert traj.error is None and len(traj) == 4
    original = list(requests)
    requests.clear()
    [again] = await runner.run_batch_from_states([traj.states[2]])
    assert again.error is None
    assert requests[0].prompt_token_ids == original[2].prompt_token_ids
    assert again.token_record() is not None and again.token_record().logprobs is None  # type: ignore[union-attr]


@pytest.mark.parametrize("schedule", ["refill", "async"])
async def test_batch_of_rollouts_each_exact(tok: ChatMLTokenizer, schedule: str) -> None:
    policy = TokenPolicy(tok)
    runner = make_runner(policy, tok)
    trajs = await runner.run_batch([0, 1, 2, 3], batch_size=2, schedule=schedule)  # type: ignore[arg-type]
    if schedule == "refill":
        assert runner.stats.generate_calls == runner.stats.rounds
    for i, traj in enumerate(trajs):
        assert traj.error is None
        assert_token_exact(traj, policy.by_rollout(i))


# -- clear errors ------------------------------------------------------------------------


def test_token_mode_needs_a_tokenizer(tok: ChatMLTokenizer) -> None:
    with pytest.raises(ValueError, match="tokenizer="):
        TrajectoryRunner(ChainEnv(), ScriptedBackend(lambda r: "x"), token_mode=True)


def test_token_mode_needs_a_token_backend() -> None:
    class Plain:
        async def generate(self, requests: Any, params: Any) -> list[Completion]:
            return []

        async def aclose(self) -> None:
            pass

    with pytest.raises(ValueError, match="Plain has no token_mode_error"):
        TrajectoryRunner(ChainEnv(), Plain(), token_mode=True)  # type: ignore[arg-type]


def test_token_mode_refuses_openai_chat_mode(tok: ChatMLTokenizer) -> None:
    chat = OpenAIBackend("http://127.0.0.1:9/v1", "m", mode="chat", tokenizer=tok)
    with pytest.raises(ValueError, match="mode='completions'"):
        TrajectoryRunner(ChainEnv(), chat, token_mode=True)
    bare = OpenAIBackend("http://127.0.0.1:9/v1", "m", mode="completions")
    with pytest.raises(ValueError, match="tokenizer="):
        TrajectoryRunner(ChainEnv(), bare, token_mode=True)
    TrajectoryRunner(
        ChainEnv(),
        OpenAIBackend("http://127.0.0.1:9/v1", "m", mode="completions", tokenizer=tok),
        token_mode=True,
    )


def test_token_mode_refuses_a_prompt_builder(tok: ChatMLTokenizer) -> None:
    with pytest.raises(ValueError, match="prompt_builder"):
        make_runner(TokenPolicy(tok), tok, prompt_builder=lambda s, t: [])


def test_chat_template_kwargs_without_token_mode() -> None:
    with pytest.raises(ValueError, match="token_mode"):
        TrajectoryRunner(ChainEnv(), ScriptedBackend(lambda r: "x"), chat_template_kwargs={"a": 1})


async def test_completion_without_token_ids_fails_that_rollout(tok: ChatMLTokenizer) -> None:
    def policy(request: GenerationRequest) -> Completion | str:
        return "right" if request.rollout_index == 0 else TokenPolicy(tok)(request)

    trajs = await make_runner(policy, tok).run_batch([0, 0])
    assert trajs[0].error is not None and trajs[0].error.type == "BackendError"
    assert "without token_ids" in trajs[0].error.message
    assert trajs[1].error is None and trajs[1].token_record() is not None


async def test_a_broken_template_fails_the_round_recorded(tok: ChatMLTokenizer) -> None:
    class Broken(ChatMLTokenizer):
        def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("no template")

    broken = Broken()
    trajs = await make_runner(TokenPolicy(broken), broken).run_batch([0, 1])
    for traj in trajs:
        assert traj.error is not None and traj.error.type == "BackendError"
        assert "chat template failed" in traj.error.message and traj.error.phase == "generate"


def test_token_record_is_none_without_token_mode() -> None:
    traj = Trajectory(episode_id="e", initial_state=State(observation=Observation(text="o")))
    assert traj.token_record() is None


def test_token_step_values() -> None:
    step = TokenStep(action_ids=(1, 2), observation_ids=(3,))
    assert step.sampled
    path = ActionPath(prefix=(9,)).append(Action(text="a"), None, tokens=step)
    assert path.token_prefix() == (9, 1, 2, 3)
    assert ActionPath().append(Action(text="a"), None).token_prefix() is None


async def test_an_environment_that_does_not_extend_the_history(tok: ChatMLTokenizer) -> None:
    """States built from action tuples (no shared history): the record still comes from the
    transitions; restoring such a state templates what it knows, once."""
    from llenvs_async import StepResult

    class TupleChain(ChainEnv):
        async def _step(self, state: State, action: Action) -> StepResult:
            result = await super()._step(state, action)
            nxt = result.next_state
            flat = State(
                observation=nxt.observation,
                task=nxt.task,
                step=nxt.step,
                episode_id=nxt.episode_id,
                actions=tuple(nxt.actions),
                terminated=nxt.terminated,
                truncated=nxt.truncated,
                hidden=nxt.hidden,
            )
            return StepResult.of(flat, result.reward)

    policy = TokenPolicy(tok)
    runner = make_runner(policy, tok, environment=TupleChain())
    [traj] = await runner.run_batch([1])
    assert traj.error is None and len(traj) == 4
    assert_token_exact(traj, policy.by_rollout(0))
    assert traj.states[2].actions.token_prefix() is None  # type: ignore[attr-defined]
    policy.requests.clear()
    [again] = await runner.run_batch_from_states([traj.states[2]])
    assert again.error is None
    first = policy.requests[0].prompt_token_ids
    assert first is not None and tok.decode(first).endswith(
        f"user\n{traj.states[2].observation.text}<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_a_backend_that_re_tokenized_the_prompt_fails_that_rollout(
    tok: ChatMLTokenizer,
) -> None:
    """A server reporting another prompt than the ids sent did not send them verbatim."""
    inner = TokenPolicy(tok)

    def policy(request: GenerationRequest) -> Completion:
        completion = inner(request)
        if request.rollout_index == 1:
            wrong = (*completion.prompt_token_ids[:-1], 7)
            return dataclasses.replace(completion, prompt_token_ids=wrong)
        return completion

    trajs = await make_runner(policy, tok).run_batch([0, 0])
    assert trajs[0].error is None
    assert trajs[1].error is not None and "verbatim" in trajs[1].error.message
    assert "first difference at position" in trajs[1].error.message


async def test_tokenizing_runs_off_the_event_loop(tok: ChatMLTokenizer) -> None:
    import threading

    class Watched(ChatMLTokenizer):
        def __init__(self) -> None:
            super().__init__()
            self.threads: set[int] = set()

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            self.threads.add(threading.get_ident())
            return super().encode(text, add_special_tokens)

    watched = Watched()
    [traj] = await make_runner(TokenPolicy(watched), watched).run_batch([2])
    assert traj.error is None and len(traj) == 5
    assert watched.threads and threading.get_ident() not in watched.threads


async def test_tools_reach_the_chat_template_in_token_mode(tok: ChatMLTokenizer) -> None:
    tool = {"type": "function", "function": {"name": "move", "parameters": {}}}
    policy = TokenPolicy(tok)
    [traj] = await make_runner(policy, tok, tools=[tool]).run_batch([1])
    first = policy.by_rollout(0)[0].prompt_token_ids
    assert first is not None and tok.decode(first).startswith(
        f"<|im_start|>system\n# Tools\n{json.dumps([tool])}<|im_end|>\n"
    )
    assert all(r.tools == (tool,) for r in policy.requests)
    assert_token_exact(traj, policy.by_rollout(0))
    # the observation turns carry no second preamble
    step = traj.transitions[0].tokens
    assert step is not None and "# Tools" not in tok.decode(step.observation_ids)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.sampled_from(["right", "left", "ri", "x y", "\n", "stay"]), min_size=1),
    stops=st.lists(st.booleans(), min_size=1),
    forced=st.sampled_from([None, "right", "left\n"]),
)
async def test_token_exactness_and_round_trip_hold_for_any_completions(
    texts: list[str], stops: list[bool], forced: str | None
) -> None:
    """Any mix of completion texts, with or without their stop token, from a reset or a
    forced first action: prompts extend exactly and the JSONL round trip keeps everything."""
    tok = ChatMLTokenizer()
    requests: list[GenerationRequest] = []

    def policy(request: GenerationRequest) -> Completion:
        requests.append(request)
        i = len(requests) - 1
        text, stop = texts[i % len(texts)], stops[i % len(stops)]
        ids = (*tok.char_ids(text), *([IM_END] if stop else []))
        return Completion(
            text=text,
            token_ids=ids,
            logprobs=tuple(-1.0 for _ in ids),
            prompt_token_ids=request.prompt_token_ids or (),
        )

    runner = make_runner(policy, tok, environment=ChainEnv(max_steps=4))
    if forced is None:
        [traj] = await runner.run_batch([1])
    else:
        [start] = await runner.run_batch([1], max_steps=1)
        requests.clear()
        [traj] = await runner.run_batch_from_state_actions([start.final_state], [forced])
    assert traj.error is None
    record = traj.token_record()
    assert record is not None
    for t, request in zip(traj.transitions[1 if forced else 0 :], requests, strict=True):
        prompt = request.prompt_token_ids or ()
        assert record.input_ids[: len(prompt)] == prompt
        assert t.completion is not None and t.completion.prompt_token_ids == prompt
    sampled = [i for t in traj.transitions if t.completion for i in t.completion.token_ids]
    assert [x for x, m in zip(record.input_ids, record.loss_mask, strict=True) if m] == sampled
    back = from_dict(Trajectory, json.loads(json.dumps(to_dict(traj))))
    assert back == traj and back.token_record() == record
    assert [t.tokens for t in back.transitions] == [t.tokens for t in traj.transitions]


@pytest.mark.parametrize("schedule", ["refill", "async"])
async def test_a_rollout_resumed_from_its_journal_is_token_exact(
    tok: ChatMLTokenizer, tmp_path: Path, schedule: str
) -> None:
    """Steps journaled as they settle (token ids attached) and read back resume a rollout
    that sends the prompts the uncut one sent and records the same token record."""
    policy = TokenPolicy(tok)
    runner = make_runner(policy, tok, schedule=schedule)
    path = tmp_path / "steps"
    with StepJournal(path) as journal:
        [traj] = await runner.run_batch(
            [4], on_step=lambda i, step, t: journal.write(("t", 0), step, t)
        )
    original = policy.by_rollout(0)
    cut = read_journal(path)[("t", 0)]
    assert cut.transitions == traj.transitions and all(t.tokens for t in cut.transitions)
    for k in (1, 3):
        policy.requests.clear()
        prefix = cut.transitions[:k]
        [again] = await runner.run_batch_from_states([prefix[-1].next_state], prefixes=[prefix])
        assert [r.prompt_token_ids for r in policy.requests] == [
            r.prompt_token_ids for r in original[k:]
        ]
        assert again.token_record() == traj.token_record()
        assert again.info["resumed_at_step"] == k
