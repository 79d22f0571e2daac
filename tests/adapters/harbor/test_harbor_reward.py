"""Reward files: JSON wins over text, and every way a reward can be bad has its own kind."""

from __future__ import annotations

import pytest

from llenvs_async.adapters.harbor import parse_reward
from llenvs_async.errors import VerifierError


@pytest.mark.parametrize(
    ("json_text", "txt_text", "reward", "source"),
    [
        (None, "1", 1.0, "reward.txt"),
        (None, " 0.25 \n", 0.25, "reward.txt"),
        (None, "1e0", 1.0, "reward.txt"),
        ('{"reward": 0.5}', "1", 0.5, "reward.json"),  # JSON wins
        ('{"reward": 1, "style": 0}', None, 1.0, "reward.json"),  # "reward" key wins
        ('{"a": 1.0, "b": 0.0}', None, 0.5, "reward.json"),  # else the mean
        ('{"only": 0.75}', None, 0.75, "reward.json"),
    ],
)
def test_reward_is_read(
    json_text: str | None, txt_text: str | None, reward: float, source: str
) -> None:
    result = parse_reward(json_text, txt_text)
    assert result.reward == reward
    assert result.source.endswith(source)


def test_json_rewards_are_all_kept() -> None:
    result = parse_reward('{"reward": 1, "style": 0.5}', None)
    assert dict(result.rewards) == {"reward": 1.0, "style": 0.5}


@pytest.mark.parametrize(
    ("json_text", "txt_text", "kind"),
    [
        (None, None, "missing"),
        (None, "", "empty"),
        (None, " \n", "empty"),
        ("", "1", "empty"),  # an empty reward.json still wins over reward.txt
        ("{}", None, "empty"),
        ("{not json", None, "malformed"),
        ("[1, 2]", None, "malformed"),
        ("0.5", None, "malformed"),
        (None, "pass", "non-numeric"),
        ('{"reward": "1"}', None, "non-numeric"),
        ('{"reward": true}', None, "non-numeric"),
        ('{"reward": null}', None, "non-numeric"),
        (None, "nan", "non-finite"),
        (None, "-inf", "non-finite"),
        ('{"reward": NaN}', None, "non-finite"),
        ('{"reward": 1, "x": Infinity}', None, "non-finite"),
    ],
)
def test_bad_rewards_have_distinct_kinds(
    json_text: str | None, txt_text: str | None, kind: str
) -> None:
    with pytest.raises(VerifierError) as info:
        parse_reward(json_text, txt_text)
    assert info.value.kind == kind
    assert info.value.path is not None and info.value.path.startswith("/logs/verifier")
