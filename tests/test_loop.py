"""The CLI's and benchmarks' loop choice: uvloop when installed, asyncio on request."""

from __future__ import annotations

import asyncio

import pytest

from llenvs_async._loop import resolve_loop, run


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_auto_picks_uvloop_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv("LLENVS_LOOP", raising=False)
    assert resolve_loop() == "uvloop"
    assert run(_loop_type()) == "uvloop"


def test_asyncio_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLENVS_LOOP", "asyncio")
    assert resolve_loop() == "asyncio"
    assert run(_loop_type()) == "asyncio"
    assert run(_loop_type(), loop="uvloop") == "uvloop"


def test_a_bad_choice_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="auto, asyncio or uvloop"):
        resolve_loop("trio")
