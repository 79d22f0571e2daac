"""``require_built_images``: test tiers use the local images ``make images`` built and never
build them at test time (a base or stand-in build downloads Debian packages)."""

from __future__ import annotations

import os

from ..docker.engine import DockerEngine

__all__ = ["require_built_images"]


async def require_built_images(engine: DockerEngine, *tags: str) -> None:
    """Skip the test when one of ``tags`` is not built (a FAILURE with ``CI=true``)."""
    import pytest

    missing = [tag for tag in tags if await engine.inspect_image(tag) is None]
    if missing:
        message = (
            f"image(s) {', '.join(missing)} not built: run `make images` "
            "(`python -m llenvs_async.docker.images build-all`); tests never download them"
        )
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
