"""Agent protocols: how a model's reply becomes shell commands or a submit, and how the
results go back to it. ``get_protocol`` turns an environment's ``action_format`` into one."""

from __future__ import annotations

from ._base import AgentProtocol, Call, CallResult, Parsed, is_model_output
from .text import TextProtocol
from .tools import ToolsProtocol

__all__ = [
    "PROTOCOLS",
    "AgentProtocol",
    "Call",
    "CallResult",
    "Parsed",
    "TextProtocol",
    "ToolsProtocol",
    "get_protocol",
    "is_model_output",
]

PROTOCOLS: dict[str, type[AgentProtocol]] = {"text": TextProtocol, "tools": ToolsProtocol}
"""The built-in formats by name (``action_format="text"`` / ``"tools"``)."""


def get_protocol(spec: str | AgentProtocol, *, submit_word: str = "SUBMIT") -> AgentProtocol:
    """The protocol named ``spec`` with ``submit_word``; a protocol given is returned as it is
    (its own submit word kept)."""
    if isinstance(spec, AgentProtocol):
        return spec
    cls = PROTOCOLS.get(spec)
    if cls is None:
        known = ", ".join(repr(name) for name in PROTOCOLS)
        raise ValueError(
            f"unknown action format {spec!r}; the known formats are {known} "
            "(or pass an AgentProtocol)"
        )
    return cls(submit_word=submit_word)
