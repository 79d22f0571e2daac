"""Small helpers the tiers share: whether this is CI, and the built-images check."""

from __future__ import annotations

import os

import pytest

from llenvs_async.docker.engine import DockerEngine


def in_ci() -> bool:
    """``CI=true`` (or 1/yes): every skip then fails (``tests/conftest.py``)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


async def require_built_images(engine: DockerEngine, *tags: str) -> None:
    """Skip the test when one of ``tags`` is not built: tests use the local images
    ``make images`` built and never build them (a base or stand-in build downloads)."""
    missing = [tag for tag in tags if await engine.inspect_image(tag) is None]
    if missing:
        pytest.skip(
            f"image(s) {', '.join(missing)} not built: run `make images` "
            "(`python -m llenvs_async.docker.images build-all`); tests never download them"
        )
