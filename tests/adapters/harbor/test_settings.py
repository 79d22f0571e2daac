"""``HarborSettings``: every rule is checked once, there, named by field (and by flag where the
CLI words it); the value round-trips through JSON, older results files' names included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llenvs_async.adapters.harbor import HarborAdapter, HarborSettings, HarborSettingsError
from llenvs_async.cli._options import HARBOR_FLAGS
from llenvs_async.protocols import TextProtocol

RULES: list[tuple[dict[str, Any], str, str]] = [
    ({"provision_verifier": True}, "provision_verifier",
     "--provision-verifier fetches at build time: it needs --build-network"),
    ({"provision_index_url": "http://127.0.0.1:1/simple"}, "provision_index_url",
     "--provision-index-url is the index of --provision-verifier"),
    ({"runtime": "kata"}, "runtime", "--runtime must be 'runc' or 'gvisor', got 'kata'"),
    ({"warm_pool": -1}, "warm_pool", "warm_pool must be an int >= 0, got -1"),
    ({"warm_pool": 2, "runtime": "gvisor"}, "warm_pool", "not boxes of runtime 'gvisor'"),
    ({"action_format": "xml"}, "action_format", "--action-format must be one of text, tools"),
    ({"max_format_errors": 0}, "max_format_errors", "--max-format-errors must be >= 1, got 0"),
    ({"max_observation_chars": 10}, "max_observation_chars",
     "--observation-chars must be >= 64, got 10"),
    ({"command_timeout_sec": 0}, "command_timeout_sec", "--command-timeout must be > 0 seconds"),
    ({"start_step": " "}, "start_step", "--start-step needs a step name"),
    ({"build_ca_bundle": "/nonexistent.pem"}, "build_ca_bundle",
     "--build-ca-bundle '/nonexistent.pem': no such file"),
    ({"base_image_aliases": [("only-one",)]}, "base_image_aliases", "(pattern, image) pairs"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "field", "flagged"), RULES)
def test_each_rule_names_its_field_and_words_it_with_the_flags(
    values: dict[str, Any], field: str, flagged: str
) -> None:
    with pytest.raises(HarborSettingsError) as info:
        HarborSettings(**values)
    assert info.value.field == field and isinstance(info.value, ValueError)
    assert flagged in info.value.wording(HARBOR_FLAGS)
    assert "{" not in str(info.value) and field.split("_")[0] in str(info.value)


def test_the_adapter_checks_its_settings_through_the_same_rules(tmp_path: Path) -> None:
    with pytest.raises(HarborSettingsError, match="provision_verifier fetches at build time"):
        HarborAdapter(provision_verifier=True)
    with pytest.raises(TypeError, match="not both"):
        HarborAdapter(settings=HarborSettings(), allow_network=True)
    adapter = HarborAdapter(cache_dir=tmp_path, settings=HarborSettings(warm_pool=1))
    assert adapter.pool is not None and adapter.settings.warm_pool == 1


def test_settings_round_trip_through_json(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    settings = HarborSettings(
        allow_network=True, base_image_aliases={"python:3.*": "mine"}, build_network=True,
        build_ca_bundle=str(ca), provision_verifier=True, runtime="gvisor",
        artifacts_dir=str(tmp_path / "art"), action_format="tools", max_format_errors=None,
        max_observation_chars=None, system_prompt="Be brief.", command_timeout_sec="task",
        start_step="second",
    )  # fmt: skip
    assert settings.base_image_aliases == (("python:3.*", "mine"),)
    assert HarborSettings.from_json(settings.to_json()) == settings
    with pytest.raises(HarborSettingsError, match="unknown setting 'colour'") as info:
        HarborSettings.from_json({"colour": "red"})
    assert info.value.field == "colour"
    with pytest.raises(HarborSettingsError, match="custom AgentProtocol, which has no JSON"):
        HarborSettings(action_format=TextProtocol()).to_json()
