"""Token mode: each rollout's prompt kept as token ids and extended by deltas, never re-rendered.

Turn t+1's prompt is turn t's prompt + the ids the engine sampled (exactly as returned)
+ the ids of the templated observation turn. The chat template is used only for the
new piece: an observation is rendered after a placeholder assistant message and the
text after the placeholder's content (the end of the assistant turn, the user turn,
the generation prompt) is tokenized; end-of-turn ids the engine already sampled (its
stop token) are not repeated. Tokenizing runs in a worker thread, once per round for
the whole batch.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from .._chat import message_dict
from ..backends.base import TokenizerBackend
from ..errors import BackendError, LlenvsError
from ..types import ActionPath, ChatMessage, Completion, GenerationRequest, TokenStep
from ._rollout import assistant_message, conversation, observation_messages

if TYPE_CHECKING:
    from ._rollout import Rollout

__all__ = ["ChatFrame", "TokenPrompts", "check_token_backend", "token_mismatch"]

T = TypeVar("T")

# Placeholder contents: what the template puts around them is what we cut out.
_CONTENT = "\u2063llenvs-assistant-content\u2063"
_DUMMY_USER = {"role": "user", "content": "\u2063llenvs-user\u2063"}


def check_token_backend(backend: Any) -> TokenizerBackend:
    """``backend`` if it can serve token mode, else a ``ValueError`` saying what is missing."""
    if not isinstance(backend, TokenizerBackend):
        raise ValueError(
            f"token_mode=True needs a backend that sends prompt token ids verbatim and has a "
            f"tokenizer (VLLMBackend, OpenAIBackend in completions mode, ScriptedBackend with "
            f"tokenizer=): {type(backend).__name__} has no token_mode_error()/get_tokenizer()"
        )
    problem = backend.token_mode_error()
    if problem is not None:
        raise ValueError(f"token_mode=True: {problem}")
    return backend


@dataclass(frozen=True, slots=True)
class ChatFrame:
    """A tokenizer and its chat template, cut into the pieces token mode appends."""

    tokenizer: Any
    kwargs: Mapping[str, Any]
    close_text: str = ""  # what the template puts after an assistant message's content
    close: tuple[int, ...] = ()  # ... and its ids

    @classmethod
    def build(cls, tokenizer: Any, kwargs: Mapping[str, Any]) -> ChatFrame:
        frame = cls(tokenizer=tokenizer, kwargs=kwargs)
        text = frame.render([_DUMMY_USER, {"role": "assistant", "content": _CONTENT}], False)
        close = _after_content(text)
        return replace(frame, close_text=close, close=frame.encode(close))

    def render(self, messages: Sequence[Mapping[str, str]], generation_prompt: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages),
                tokenize=False,
                add_generation_prompt=generation_prompt,
                **self.kwargs,
            )
        except Exception as exc:
            raise BackendError(
                f"token mode: the tokenizer's chat template failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(text, str):
            raise BackendError(
                f"token mode: apply_chat_template(tokenize=False) returned a "
                f"{type(text).__name__}, not a str"
            )
        return text

    def encode(self, text: str) -> tuple[int, ...]:
        # The rendered text already holds the template's special tokens: add none.
        return tuple(int(t) for t in self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        """A whole conversation templated once, up to the generation prompt (a start prompt)."""
        rendered = self.render([message_dict(m) for m in messages], True)
        return self.encode(rendered)

    def assistant(self, message: ChatMessage) -> tuple[int, ...]:
        """A forced action as the model would have written it: content + end of turn; with
        tool calls, the template's rendering of the turn after its generation prompt."""
        if not message.tool_calls:
            return self.encode(message.content + self.close_text)
        head = self.render([_DUMMY_USER], True)
        whole = self.render([_DUMMY_USER, message_dict(message)], False)
        if not whole.startswith(head):
            raise BackendError(
                "token mode: the chat template renders an assistant turn with tool calls "
                "differently from its generation prompt; cannot write a forced tool call as ids"
            )
        return self.encode(whole[len(head) :])

    def observation(
        self, action_ids: Sequence[int], messages: Sequence[ChatMessage]
    ) -> tuple[int, ...]:
        """The ids after ``action_ids`` up to the next generation prompt: the rest of the
        assistant turn (what the engine did not sample of it), then the observation's turns
        (``user``, or one ``tool`` reply per call)."""
        rendered = self.render(
            [
                _DUMMY_USER,
                {"role": "assistant", "content": _CONTENT},
                *(message_dict(m) for m in messages),
            ],
            True,
        )
        ids = self.encode(_after_content(rendered))
        return ids[_overlap(action_ids, ids, len(self.close)) :]


def _after_content(rendered: str) -> str:
    at = rendered.find(_CONTENT)
    if at < 0:
        raise BackendError(
            "token mode: the chat template dropped an assistant message's content; "
            "cannot find where an assistant turn ends"
        )
    return rendered[at + len(_CONTENT) :]


def _overlap(action_ids: Sequence[int], ids: Sequence[int], limit: int) -> int:
    """The longest k <= limit with ``action_ids[-k:] == ids[:k]`` (an end-of-turn the engine
    already generated, such as its stop token)."""
    for k in range(min(limit, len(action_ids), len(ids)), 0, -1):
        if list(action_ids[-k:]) == list(ids[:k]):
            return k
    return 0


class TokenPrompts:
    """One runner's token mode: its backend's tokenizer, cut into a ``ChatFrame`` once, and
    the batched per-round work (start prompts, forced actions, observation turns)."""

    def __init__(
        self,
        backend: TokenizerBackend,
        chat_template_kwargs: Mapping[str, Any],
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self._backend = backend
        # Tool definitions reach the template as its ``tools`` variable (HF's convention).
        tool_kwargs = {"tools": [dict(t) for t in tools]} if tools else {}
        self._kwargs = {**chat_template_kwargs, **tool_kwargs}
        self._frame: ChatFrame | None = None
        self._ready = asyncio.Lock()
        self._tokenizer_lock = threading.Lock()  # concurrent runs share one tokenizer

    async def frame(self) -> ChatFrame:
        async with self._ready:
            if self._frame is None:
                tokenizer = await self._backend.get_tokenizer()
                self._frame = await asyncio.to_thread(ChatFrame.build, tokenizer, self._kwargs)
        return self._frame

    async def _batch(self, work: Sequence[Callable[[ChatFrame], T]]) -> list[T | LlenvsError]:
        """Run every item in one worker thread; an item's own ``LlenvsError`` is its result."""
        frame = await self.frame()

        def run() -> list[T | LlenvsError]:
            out: list[T | LlenvsError] = []
            with self._tokenizer_lock:
                for item in work:
                    try:
                        out.append(item(frame))
                    except LlenvsError as exc:
                        out.append(exc)
            return out

        return await asyncio.to_thread(run)

    async def start(
        self, rollouts: Sequence[Rollout], preamble: Sequence[ChatMessage]
    ) -> list[Rollout]:
        """Give every rollout without one its start prompt (the start state's token prefix,
        else its conversation templated once, then kept on the state). Returns the rollouts
        that failed (recorded on them)."""
        todo = [r for r in rollouts if r.prompt_ids is None and not r.finished]
        if not todo:
            return []
        try:
            results = await self._batch([_start_work(r, preamble) for r in todo])
        except LlenvsError as exc:  # no tokenizer: the round fails, as a raising backend's
            for rollout in todo:
                rollout.fail(exc, "generate")
            return todo
        failed: list[Rollout] = []
        for rollout, result in zip(todo, results, strict=True):
            if isinstance(result, LlenvsError):
                rollout.fail(result, "generate")
                failed.append(rollout)
                continue
            prefix, templated = result
            state = rollout.state
            assert state is not None and type(state.actions) is ActionPath
            if templated:  # keep it on the state: what restores from here will send
                state = replace(state, actions=state.actions.with_prefix(prefix))
                if not rollout.length:  # a resumed rollout keeps the state it began in
                    rollout.initial_state = state
                rollout.state = state
            rollout.prompt_ids = prefix
        return failed

    async def extend(self, rollouts: Sequence[Rollout]) -> None:
        """Append each rollout's new step (action ids + observation turn) to its prompt and
        record the ``TokenStep`` on the transition and on the next state's history node."""
        todo = [r for r in rollouts if r.steps and r.step(-1).tokens is None]
        if not todo:
            return
        work = []
        for rollout in todo:
            t = rollout.step(-1)
            # A forced action (no completion) is written as the environment shows it.
            observation = t.next_state.observation
            forced = None if t.completion is not None else assistant_message(t.action, observation)
            action_ids = () if t.completion is None else t.completion.token_ids
            messages = observation_messages(observation)
            work.append(_observation_work(action_ids, forced, messages))
        for rollout, result in zip(todo, await self._batch(work), strict=True):
            if isinstance(result, LlenvsError):
                rollout.fail(result, "step")
                continue
            _record(rollout, result)


def token_mismatch(completion: Completion, request: GenerationRequest) -> BackendError | None:
    """Why ``completion`` cannot extend the rollout's token prompt (None when it can): it
    has no sampled ids, or the backend reports a prompt other than the one sent (a server
    that re-tokenized it)."""
    if not completion.token_ids:
        return BackendError(
            "token mode: the backend returned a completion without token_ids "
            f"(text {completion.text[:60]!r}); it must return the sampled ids"
        )
    sent, seen = request.prompt_token_ids or (), completion.prompt_token_ids
    if seen and seen != sent:
        at = next((i for i, (a, b) in enumerate(zip(sent, seen, strict=False)) if a != b), None)
        where = f"first difference at position {at}" if at is not None else "lengths differ"
        return BackendError(
            f"token mode: the backend reports a prompt of {len(seen)} ids for the {len(sent)} "
            f"sent ({where}): it did not send prompt_token_ids verbatim"
        )
    return None


def _start_work(
    rollout: Rollout, preamble: Sequence[ChatMessage]
) -> Callable[[ChatFrame], tuple[tuple[int, ...], bool]]:
    state = rollout.state
    assert state is not None and type(state.actions) is ActionPath
    path = state.actions

    def work(frame: ChatFrame) -> tuple[tuple[int, ...], bool]:
        prefix = path.token_prefix()
        templated = prefix is None
        if prefix is None:
            prefix = frame.prompt([*preamble, *conversation(state)])
        return prefix, templated

    return work


def _observation_work(
    action_ids: tuple[int, ...], forced: ChatMessage | None, messages: Sequence[ChatMessage]
) -> Callable[[ChatFrame], TokenStep]:
    def work(frame: ChatFrame) -> TokenStep:
        ids = action_ids if forced is None else frame.assistant(forced)
        return TokenStep(
            action_ids=ids,
            observation_ids=frame.observation(ids, messages),
            sampled=forced is None,
        )

    return work


def _record(rollout: Rollout, step: TokenStep) -> None:
    t = rollout.step(-1)
    assert rollout.prompt_ids is not None
    next_state = t.next_state
    if next_state.history.extends(t.state.history):  # share the node: O(1) per step
        assert type(next_state.actions) is ActionPath
        next_state = replace(next_state, actions=next_state.actions.with_tokens(step))
    rollout.set_last(replace(t, next_state=next_state, tokens=step))
    if rollout.state is t.next_state:
        rollout.state = next_state
    rollout.prompt_ids = rollout.prompt_ids + step.action_ids + step.observation_ids
