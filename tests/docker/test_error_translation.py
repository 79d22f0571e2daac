"""Foreign errors raised inside the Docker client become ours at the docker layer's edge."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from llenvs_async import ErrorInfo
from llenvs_async.docker.engine import raised_inside_client, translate_errors
from llenvs_async.errors import ContainerError


def _defined_in(filename: str, exc: type[BaseException]) -> Callable[[], None]:
    """A function whose frame reports ``filename`` (as one inside aiohttp would)."""
    namespace: dict[str, object] = {}
    code = f"def boom():\n    raise {exc.__name__}('client state')\n"
    exec(compile(code, filename, "exec"), namespace)
    return namespace["boom"]  # type: ignore[return-value]


_INSIDE = f"{os.sep}site-packages{os.sep}aiohttp{os.sep}streams.py"


@pytest.mark.parametrize("exc", [AssertionError, AttributeError, TypeError])
def test_assertion_inside_the_client_is_a_container_error(exc: type[BaseException]) -> None:
    boom = _defined_in(_INSIDE, exc)
    with pytest.raises(ContainerError) as info, translate_errors("exec 'ls'", container_id="c1"):
        boom()
    assert info.value.container_id == "c1"
    assert exc.__name__ in str(info.value) and "inside the Docker client" in str(info.value)
    assert isinstance(info.value.__cause__, exc)
    # ...and its structured fields survive into the rollout's ErrorInfo
    recorded = ErrorInfo.from_exception(info.value, phase="step")
    assert recorded.details["container_id"] == "c1"


@pytest.mark.parametrize("exc", [AssertionError, AttributeError, TypeError])
def test_our_own_programming_errors_still_propagate(exc: type[BaseException]) -> None:
    boom = _defined_in(f"{os.sep}work{os.sep}mycode.py", exc)
    with pytest.raises(exc), translate_errors("exec 'ls'"):
        boom()


def test_raised_inside_client_looks_at_the_innermost_frame() -> None:
    with pytest.raises(AssertionError) as info:
        _defined_in(_INSIDE, AssertionError)()
    assert raised_inside_client(info.value)
    assert not raised_inside_client(AssertionError("never raised"))
