"""vLLM's own tool-call and reasoning parsers, run here as ``vllm serve`` runs them.

``OutputParsers`` takes the names ``vllm serve --tool-call-parser/--reasoning-parser`` take
(``hermes``, ``qwen3``, ...) and composes vLLM's parser classes with vLLM's own
``ParserManager``, as the server's chat route does. Per request, ``plan`` builds vLLM's
``ChatCompletionRequest`` for the request's tools and ``tool_choice`` and runs the
parser's ``adjust_request`` on it: what that sets (the structured-output grammar that
forces a call for ``tool_choice="required"`` or a named function; ``skip_special_tokens``)
goes into the sampling parameters, and ``ParsePlan.apply`` then splits the engine's text
with the parser's ``parse``: reasoning into ``Completion.reasoning``, tool calls into
``Completion.tool_calls`` (OpenAI's objects), the content left as ``text``. Token ids and
logprobs are never touched. vLLM is imported lazily, only when parsers are asked for.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._chat import message_dict
from ..errors import BackendError
from ..types import Completion, GenerationRequest

__all__ = [
    "STRICT_LEVELS",
    "OutputParsers",
    "ParsePlan",
    "check_parser_names",
    "forces_tool_call",
]

STRICT_LEVELS = ("auto", "function", "parameter")
_PLACEHOLDER = [{"role": "user", "content": ""}]


def forces_tool_call(tool_choice: str | Mapping[str, Any] | None) -> bool:
    """``tool_choice`` is ``"required"`` or a named function (a call must be made)."""
    return tool_choice == "required" or isinstance(tool_choice, Mapping)


def check_parser_names(
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    tool_strict_level: str,
    *,
    owner: str,
) -> None:
    """A ``ValueError`` naming the value and the names vLLM knows for an unknown parser name
    (or strict level); a ``BackendError`` when parsers are asked for and vLLM is missing."""
    if tool_strict_level not in STRICT_LEVELS:
        raise ValueError(
            f"{owner} tool_strict_level must be one of {', '.join(STRICT_LEVELS)}, "
            f"got {tool_strict_level!r}"
        )
    if tool_call_parser is None and reasoning_parser is None:
        return
    try:
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager
    except ImportError as exc:
        raise BackendError(
            f"{owner}(tool_call_parser=..., reasoning_parser=...) parses with vLLM's own "
            f"parsers, and vLLM is not importable ({exc}): install vLLM (make vllm)"
        ) from exc
    for kind, name, known in (
        ("tool_call_parser", tool_call_parser, ToolParserManager.list_registered()),
        ("reasoning_parser", reasoning_parser, ReasoningParserManager.list_registered()),
    ):
        if name is not None and name not in known:
            raise ValueError(
                f"{owner} {kind}={name!r} is not a vLLM parser; vLLM {_vllm_version()} has: "
                f"{', '.join(known)}"
            )


def _vllm_version() -> str:
    try:
        import vllm
    except ImportError:  # pragma: no cover - checked by the caller
        return "?"
    return str(getattr(vllm, "__version__", "?"))


class OutputParsers:
    """The composed parser classes for one tokenizer (built once per backend).

    ``grammar_waits_for_reasoning``: the engine holds a forced call's grammar back until
    the reasoning ends (a ``vllm serve --reasoning-parser`` engine does); when it does
    not, the grammar binds from the first token, so the output holds no reasoning and is
    parsed for tool calls only.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        tool_call_parser: str | None,
        reasoning_parser: str | None,
        tool_strict_level: str = "auto",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        grammar_waits_for_reasoning: bool = False,
    ) -> None:
        from vllm.parser import ParserManager

        self.tokenizer = tokenizer
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.grammar_waits_for_reasoning = grammar_waits_for_reasoning
        if tool_call_parser is not None:
            # A malformed call is the model's output, recorded as the step's parse error;
            # vLLM's parsers would also log a traceback for every one of them.
            logging.getLogger("vllm.tool_parsers").setLevel(logging.CRITICAL)
        compose = {
            "enable_auto_tools": tool_call_parser is not None,
            "tool_strict_level": tool_strict_level,
        }
        try:
            self._full = ParserManager.get_parser(
                tool_parser_name=tool_call_parser,
                reasoning_parser_name=reasoning_parser,
                tokenizer=tokenizer,
                **compose,
            )
            # The same without reasoning: for an output that cannot hold any (see plan).
            self._tools_only = (
                ParserManager.get_parser(
                    tool_parser_name=tool_call_parser, tokenizer=tokenizer, **compose
                )
                if tool_call_parser is not None
                else None
            )
        except Exception as exc:
            raise BackendError(
                f"vLLM could not build the parsers tool_call_parser={tool_call_parser!r}, "
                f"reasoning_parser={reasoning_parser!r} for this tokenizer: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def plan(self, request: GenerationRequest, prompt_token_ids: Sequence[int]) -> ParsePlan:
        """vLLM's request for ``request``, adjusted by the parser as the server adjusts it
        (raises ``BackendError`` for what vLLM rejects: a ``tool_choice`` naming no tool...).

        Reasoning is parsed unless the output cannot hold any: the prompt already closed it
        (the parser's ``is_reasoning_end`` on the prompt, e.g. Qwen3's empty think block
        from ``enable_thinking=False``: vLLM's streaming path and its structured-output
        gate decide the same way), or a forced call's grammar binds from the first token.
        """
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        body: dict[str, Any] = {
            "model": "llenvs",
            "messages": [message_dict(m) for m in request.messages] or list(_PLACEHOLDER),
        }
        if request.tools:
            body["tools"] = [dict(tool) for tool in request.tools]
        if request.tool_choice is not None:
            choice = request.tool_choice
            body["tool_choice"] = choice if isinstance(choice, str) else dict(choice)
        try:
            chat = ChatCompletionRequest(**body)
        except Exception as exc:
            raise BackendError(
                f"vLLM rejects the request's tools/tool_choice/messages: {_first_line(exc)}"
            ) from exc
        parser: Any = None
        reasoning = self.reasoning_parser is not None
        if reasoning:
            parser = self._full(
                self.tokenizer, chat.tools, chat_template_kwargs=self.chat_template_kwargs
            )
            forced = forces_tool_call(request.tool_choice) and bool(request.tools)
            if parser.is_reasoning_end(list(prompt_token_ids)) or (
                forced and not self.grammar_waits_for_reasoning
            ):
                reasoning, parser = False, None
        if parser is None:
            if self._tools_only is None:
                return ParsePlan(parser=None, chat=chat)
            parser = self._tools_only(
                self.tokenizer, chat.tools, chat_template_kwargs=self.chat_template_kwargs
            )
        if reasoning or chat.tool_choice != "none":  # as the server's renderer decides
            try:
                chat = parser.adjust_request(chat)
            except Exception as exc:
                raise BackendError(
                    f"vLLM's parser rejects the request's tools/tool_choice: {_first_line(exc)}"
                ) from exc
        sampling: dict[str, Any] = {"skip_special_tokens": chat.skip_special_tokens}
        structured = chat.structured_outputs
        if structured is not None:
            sampling["structured_outputs"] = structured
        return ParsePlan(
            parser=parser,
            chat=chat,
            sampling=sampling,
            auto_tools=self.tool_call_parser is not None,
        )


@dataclass
class ParsePlan:
    """One request's parser, vLLM request and sampling overrides."""

    parser: Any
    chat: Any
    sampling: dict[str, Any] = field(default_factory=dict)
    auto_tools: bool = False

    def apply(self, completion: Completion) -> Completion:
        """``completion`` with reasoning and tool calls split off its text, as the server's
        chat response would carry them (token ids and logprobs unchanged)."""
        if self.parser is None:
            return completion
        reasoning, content, calls = self.parser.parse(
            completion.text,
            self.chat,
            enable_auto_tools=self.auto_tools,
            model_output_token_ids=completion.token_ids,
        )
        tool_calls = tuple(_tool_call_dict(call) for call in calls or ())
        finish = completion.finish_reason
        choice = self.chat.tool_choice
        if finish == "stop" and (
            (tool_calls and (choice == "auto" or choice is None)) or choice == "required"
        ):
            finish = "tool_calls"  # what the server reports
        return replace(
            completion,
            text=content or "",
            reasoning=reasoning or None,
            tool_calls=tool_calls,
            finish_reason=finish,
        )


def _tool_call_dict(call: Any) -> dict[str, Any]:
    from vllm.renderers.chat_utils import make_tool_call_id

    arguments = call.arguments
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": getattr(call, "id", None) or make_tool_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
