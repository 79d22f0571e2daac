"""Image names: which LOCAL image a name a task uses stands for (no registry is ever contacted).

Every image a Dockerfile names (``FROM``, ``COPY --from=``, ``ARG``-expanded) or a task's
prebuilt ``docker_image`` resolves, in order, to: the user's aliases (``fnmatch`` patterns,
on the name as written or normalised), the normalised name itself when present
(``docker.io/library/``, ``public.ecr.aws/docker/library/`` and ``@sha256:`` digests
dropped, ``:latest`` added), then the built-in stand-ins (``debian:*``, ``ubuntu:*`` -> our
bookworm base, ``python:3*`` -> bookworm + python3/pip; see ``STANDIN_PATTERNS``). A name
that resolves to nothing gets a hint saying how to map it (``ImageResolver.how_to_map``);
``astral-sh/uv:X`` is then built from its wheel where the build has a network
(``uv_standin.py``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence

from ....docker.engine import DockerEngine
from ....docker.images import STANDIN_PATTERNS, STANDIN_PYTHON

__all__ = ["ImageResolver", "alias_matches", "normalise_image_ref", "parse_alias", "uv_version"]

_UV_IMAGE_RE = re.compile(r"^(?:ghcr\.io/)?astral-sh/uv:(\d+\.\d+\.\d+)$")

_DOCKER_HUB_PREFIXES = (
    "docker.io/library/",
    "index.docker.io/library/",
    "registry-1.docker.io/library/",
    "public.ecr.aws/docker/library/",
    "mirror.gcr.io/library/",
    "docker.io/",
    "index.docker.io/",
    "registry-1.docker.io/",
    "library/",
)


def normalise_image_ref(ref: str) -> str:
    """``repository:tag`` of an image reference: registry prefix of Docker Hub's official
    images and any ``@sha256:`` digest dropped, ``:latest`` when no tag is given."""
    name = ref.split("@", 1)[0]
    lowered = name.lower()
    for prefix in _DOCKER_HUB_PREFIXES:
        if lowered.startswith(prefix):
            name = name[len(prefix) :]
            break
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def uv_version(ref: str) -> str | None:
    """The uv version an ``astral-sh/uv:X.Y.Z`` image name pins, else ``None``."""
    match = _UV_IMAGE_RE.match(ref)
    return match[1] if match else None


def parse_alias(text: str) -> tuple[str, str]:
    """``"PATTERN=IMAGE"`` (the CLI's ``--base-image``) -> ``(PATTERN, IMAGE)``."""
    pattern, sep, image = text.partition("=")
    if not sep or not pattern.strip() or not image.strip():
        raise ValueError(
            f"a base-image alias is PATTERN=IMAGE (e.g. 'python:3.*=myimg'), got {text!r}"
        )
    return pattern.strip(), image.strip()


def alias_matches(pattern: str, ref: str) -> bool:
    """Whether an alias ``pattern`` matches ``ref`` as written or normalised."""
    return fnmatch.fnmatchcase(ref, pattern) or fnmatch.fnmatchcase(
        normalise_image_ref(ref), pattern
    )


class ImageResolver:
    """Maps the image names tasks use to local images (see the module docstring)."""

    def __init__(self, aliases: Mapping[str, str] | Sequence[tuple[str, str]] = ()) -> None:
        pairs = list(aliases.items()) if isinstance(aliases, Mapping) else list(aliases)
        self.aliases: tuple[tuple[str, str], ...] = tuple(pairs)
        self._local: dict[str, bool] = {}

    async def _present(self, engine: DockerEngine, ref: str) -> bool:
        if ref not in self._local:
            self._local[ref] = await engine.inspect_image(ref) is not None
        return self._local[ref]

    async def resolve(self, engine: DockerEngine, ref: str) -> str | None:
        """The local image for ``ref``, or ``None`` when nothing matches locally."""
        for pattern, image in self.aliases:
            if alias_matches(pattern, ref):
                return image
        if await self._present(engine, ref):
            return ref
        normal = normalise_image_ref(ref)
        if await self._present(engine, normal):
            return normal
        for pattern, image in STANDIN_PATTERNS:
            if fnmatch.fnmatchcase(normal, pattern) and await self._present(engine, image):
                return image
        return None

    def how_to_map(self, ref: str) -> str:
        normal = normalise_image_ref(ref)
        standin = next(
            (img for pat, img in STANDIN_PATTERNS if fnmatch.fnmatchcase(normal, pat)), None
        )
        hint = (
            f"build its stand-in {standin} (Python {STANDIN_PYTHON[standin]}) with "
            "`llenvs-async images build-standins`, or "
            if standin
            else ""
        )
        if (version := uv_version(ref)) is not None:
            hint = (
                f"pass --build-network (HarborAdapter(build_network=True)) to build its "
                f"stand-in from the uv {version} wheel on the package index, or "
            )
        return (
            f"no registry is reachable: {hint}map it to a local image with "
            f"--base-image '{normal}=IMAGE' (HarborAdapter(base_image_aliases={{'{normal}': "
            "IMAGE}), patterns such as 'python:3.*' allowed)"
        )
