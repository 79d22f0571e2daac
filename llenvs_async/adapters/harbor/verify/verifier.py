"""Reading a Harbor verifier's reward: ``/logs/verifier/reward.json`` or ``reward.txt``.

``reward.json`` wins when both exist. It must be a JSON object of numbers: the
episode reward is its ``"reward"`` key when present, otherwise the mean of its
values (all of them are kept in ``VerifierResult.rewards``). ``reward.txt`` holds
one number. Failures are ``VerifierError`` with ``kind`` one of ``missing``,
``empty``, ``malformed``, ``non-numeric``, ``non-finite`` (and ``timeout`` when
the verifier itself runs too long).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ....errors import VerifierError

__all__ = [
    "REWARD_JSON",
    "REWARD_TXT",
    "VERIFIER_LOG_DIR",
    "VerifierResult",
    "parse_reward",
]

VERIFIER_LOG_DIR = "/logs/verifier"
REWARD_JSON = f"{VERIFIER_LOG_DIR}/reward.json"
REWARD_TXT = f"{VERIFIER_LOG_DIR}/reward.txt"


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierResult:
    """The reward of one verification, where it came from, and how the verifier ran."""

    reward: float
    rewards: Mapping[str, float]
    source: str
    exit_code: int | None = None
    output: str = ""
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """What else the verification did (collect hooks, artifacts), merged into ``info()``."""

    def info(self) -> dict[str, Any]:
        """JSON-serialisable summary for ``StepResult.info``."""
        return {
            "reward_source": self.source,
            "rewards": dict(self.rewards),
            "verifier_exit_code": self.exit_code,
            "verifier_output": self.output,
            **self.extra,
        }


def parse_reward(json_text: str | None, txt_text: str | None) -> VerifierResult:
    """Parse the reward files' contents (``None`` = the file does not exist)."""
    if json_text is not None:
        return _parse_json(json_text)
    if txt_text is not None:
        return _parse_txt(txt_text)
    raise VerifierError(
        f"the verifier wrote neither {REWARD_JSON} nor {REWARD_TXT}",
        kind="missing",
        path=VERIFIER_LOG_DIR,
    )


def _parse_json(text: str) -> VerifierResult:
    if not text.strip():
        raise VerifierError(f"{REWARD_JSON} is empty", kind="empty", path=REWARD_JSON)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VerifierError(
            f"{REWARD_JSON} is not valid JSON: {exc}", kind="malformed", path=REWARD_JSON
        ) from exc
    if not isinstance(data, dict):
        raise VerifierError(
            f"{REWARD_JSON} must hold a JSON object of numbers, got {text.strip()[:80]!r}",
            kind="malformed",
            path=REWARD_JSON,
        )
    if not data:
        raise VerifierError(f"{REWARD_JSON} is an empty object", kind="empty", path=REWARD_JSON)
    rewards = {str(k): _finite(v, f"{REWARD_JSON} key {k!r}", REWARD_JSON) for k, v in data.items()}
    reward = (
        rewards["reward"] if "reward" in rewards else math.fsum(rewards.values()) / len(rewards)
    )
    return VerifierResult(reward=reward, rewards=MappingProxyType(rewards), source=REWARD_JSON)


def _parse_txt(text: str) -> VerifierResult:
    if not text.strip():
        raise VerifierError(f"{REWARD_TXT} is empty", kind="empty", path=REWARD_TXT)
    try:
        value: object = float(text)
    except ValueError:
        value = text.strip()
    reward = _finite(value, REWARD_TXT, REWARD_TXT)
    return VerifierResult(
        reward=reward, rewards=MappingProxyType({"reward": reward}), source=REWARD_TXT
    )


def _finite(value: object, what: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VerifierError(
            f"{what} is not a number: {str(value)[:80]!r}", kind="non-numeric", path=path
        )
    if not math.isfinite(value):
        raise VerifierError(f"{what} is not finite: {value!r}", kind="non-finite", path=path)
    return float(value)
