"""Stand-ins for astral-sh/uv's images: ``COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx
/bin/`` (or ``FROM ghcr.io/astral-sh/uv:0.8.15 AS uv``) builds without a registry.

Where no local image answers to the name and the build has a network, the Dockerfile gets a
stage of its own instead: ``python:3`` (a stand-in like any other ``FROM``) downloads the
``uv`` wheel of that version from the package index (``--provision-index-url`` if given)
and puts its ``uv`` and ``uvx`` at ``/uv`` and ``/uvx``, where the upstream image has them;
the task's references name that stage. Built with the task's image, so cached with it.
``llenvs-async images build-standins --uv VERSION`` builds the same as a local image of
that name instead (``docker.images.ensure_uv_standin``), which then answers to it offline.
"""

from __future__ import annotations

import re

from ....docker.images import uv_wheel_stage
from .dockerfile import ImageUse, image_uses, rewrite_images
from .image_names import uv_version

__all__ = ["with_uv_stages"]

_FIRST_FROM_RE = re.compile(r"^\s*FROM\s", re.IGNORECASE)
_STAGE_IMAGE = "python:3.12-slim"


def _stage_name(version: str) -> str:
    return f"llenvs-uv-{version.replace('.', '-')}"


def with_uv_stages(dockerfile: str, refs: set[str], *, index_url: str | None = None) -> str:
    """``dockerfile`` with a uv stage for each name in ``refs`` (uv image names that have
    no local image) and every reference to one naming its stage instead."""
    renamed = [
        ImageUse(written=written, line=index, image=_stage_name(version), kind=kind)
        for index, kind, written in image_uses(dockerfile)
        if written in refs and (version := uv_version(written)) is not None
    ]
    if not renamed:
        return dockerfile
    versions = dict.fromkeys(uv_version(use.written) or "" for use in renamed)
    stages = [
        uv_wheel_stage(v, name=_stage_name(v), base=_STAGE_IMAGE, index_url=index_url)
        for v in versions
    ]
    lines = rewrite_images(dockerfile, renamed, ca_bundle=False).split("\n")
    first = next(i for i, line in enumerate(lines) if _FIRST_FROM_RE.match(line))
    lines[first:first] = stages
    return "\n".join(lines)
