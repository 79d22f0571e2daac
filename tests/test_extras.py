"""A missing optional dependency is one error type, ``MissingExtraError``, naming the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llenvs_async._extras import import_extra
from llenvs_async.errors import LlenvsError, MissingExtraError


def test_a_missing_module_names_what_needs_it_and_the_extra() -> None:
    with pytest.raises(MissingExtraError) as info:
        import_extra("no_such_module_xyz", extra="trl", what="a test", package="TRL")
    error = info.value
    assert isinstance(error, ImportError) and isinstance(error, LlenvsError)
    assert str(error).startswith("a test needs TRL: pip install 'llenvs-async[trl]' (")
    assert "ModuleNotFoundError" in str(error) and error.extra == "trl"
    assert import_extra("json", extra="x", what="w", package="p") is sys.modules["json"]


def test_catch_all_takes_a_package_that_fails_with_an_error_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path
    (root / "broken_pkg_xyz.py").write_text("raise RuntimeError('needs Python 3.12')\n")
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(RuntimeError):
        import_extra("broken_pkg_xyz", extra="skyrl", what="w", package="p")
    with pytest.raises(MissingExtraError, match=r"RuntimeError: needs Python 3.12"):
        import_extra("broken_pkg_xyz", extra="skyrl", what="w", package="p", catch_all=True)


def test_every_integration_raises_the_one_type() -> None:
    from llenvs_async.integrations import openenv, skyrl, trl, verifiers
    from llenvs_async.integrations import verl as verl_module
    from llenvs_async.serialization import atif

    names = (trl.TRLUnavailableError, skyrl.SkyRLUnavailableError, atif.AtifUnavailableError,
             openenv.OpenEnvUnavailableError, verifiers.VerifiersUnavailableError,
             verl_module.VerlUnavailableError)  # fmt: skip
    assert set(names) == {MissingExtraError}
