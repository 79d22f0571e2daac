"""``provision_verifier``: what the common uv/uvx verifier fetches at test time, fetched at
build time instead, so the verifier runs offline (and no verification downloads it again).

Recognised in ``tests/test.sh`` (after joining ``\\``-continued lines), and nothing else:

- the installer, exactly ``curl <flags> https://astral.sh/uv/<X.Y.Z>/install.sh | sh``
  (or ``| bash``; ``wget -qO- <url> | sh`` too), with a pinned version: it is REQUIRED;
- ``uvx`` runs of ``pytest`` whose only options are ``-p``/``--python VER`` and
  ``-w``/``--with PKG`` (``=`` forms too), e.g. ``uvx -p 3.13 -w pytest==8.4.1
  -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py``;
  any other ``uvx`` option or tool, or any other line naming ``uvx`` (e.g.
  ``command -v uvx``), leaves the whole script untouched;
- ``apt-get update`` and ``apt-get install [-y|-qq|--no-install-recommends] curl`` lines
  (they only serve the installer).

When a script matches, the task image gets (after the task's own Dockerfile, as root):
``uv==X`` from PyPI (``pip download`` in a ``python:3`` stage; the ``uv``/``uvx`` binaries
copied to ``/usr/local/bin``, ``$HOME/.local/bin/env`` as the installer writes it), then
each recognised ``uvx`` command run once with ``pytest --version`` so its packages (and
its Python, when uv can download it) sit in ``/opt/llenvs-uv``'s cache. At test time the
installer and apt lines become ``:`` no-ops (commented with what they were) and the
verifier runs with ``UV_OFFLINE=1``. It needs a build network (``build_network``).
``index_url`` (``provision_index_url``) points both downloads at another package index
(a PEP 503 ``/simple`` URL, e.g. a mirror on 127.0.0.1): used by the build, and named
(offline) to the verifier, since uv keys its cached index pages on the index URL.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

__all__ = [
    "UV_CACHE_DIR",
    "VerifierProvision",
    "detect_provision",
    "offline_test_sh",
    "provision_dockerfile",
    "rewrite_test_sh",
]

UV_CACHE_DIR = "/opt/llenvs-uv/cache"
_UV_PYTHON_DIR = "/opt/llenvs-uv/python"
_STAGE = "llenvs-uv-provision"
_STAGE_IMAGE = "python:3.12-slim"  # a pip-capable stage; resolved like any FROM (stand-ins)
_INSTALLER_RE = re.compile(
    r"^\s*(?:curl(?:\s+-[A-Za-z]+)*|wget\s+-qO-)\s+(?:['\"]?)https://astral\.sh/uv/"
    r"(\d+\.\d+\.\d+)/install\.sh(?:['\"]?)\s*\|\s*(?:sh|bash)\s*$"
)
_APT_RE = re.compile(
    r"^\s*apt-get\s+(?:update(?:\s+-qq|\s+-q)?|install(?:\s+(?:-y|-qq|-q|--no-install-recommends))*"
    r"\s+curl(?:\s+(?:-y|-qq|-q|--no-install-recommends))*)\s*$"
)
_FROM_RE = re.compile(r"^\s*FROM\s", re.IGNORECASE)
_VALUE_OPTIONS = {"-p": "python", "--python": "python", "-w": "with", "--with": "with"}
_ENV_FILE = (
    '#!/bin/sh\\ncase ":${PATH}:" in *":$HOME/.local/bin:"*) ;; '
    '*) export PATH="$HOME/.local/bin:$PATH" ;; esac\\n'
)


@dataclass(frozen=True, slots=True, kw_only=True)
class UvxRun:
    """One recognised ``uvx`` run: its Python request and its ``--with`` packages."""

    python: str | None
    with_packages: tuple[str, ...]
    tool: str


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierProvision:
    """What a recognised ``test.sh`` fetches: uv at ``uv_version`` and its ``uvx`` runs."""

    uv_version: str
    runs: tuple[UvxRun, ...]


def _logical_lines(text: str) -> list[str]:
    return text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines()


def _uvx_run(line: str) -> UvxRun | bool | None:
    """A ``uvx`` line parsed; ``None``: not a uvx line; ``False``: a uvx line we do not
    recognise (the script is then left alone)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None if "uvx" not in line else False
    if not words or words[0] != "uvx":
        return False if "uvx" in words else None
    python: str | None = None
    packages: list[str] = []
    rest = words[1:]
    while rest and rest[0].startswith("-"):
        option, _, inline = rest.pop(0).partition("=")
        kind = _VALUE_OPTIONS.get(option)
        if kind is None or (not inline and not rest):
            return False
        value = inline or rest.pop(0)
        if kind == "python":
            python = value
        else:
            packages.append(value)
    if not rest or re.split(r"[=<>!~\[]", rest[0], maxsplit=1)[0] != "pytest":
        return False
    return UvxRun(python=python, with_packages=tuple(packages), tool=rest[0])


def detect_provision(test_sh: str) -> VerifierProvision | None:
    """The provisioning ``test_sh`` needs, or ``None`` when it does not match the
    recognised shape exactly (see the module docstring)."""
    version: str | None = None
    runs: list[UvxRun] = []
    for line in _logical_lines(test_sh):
        if match := _INSTALLER_RE.match(line):
            version = match[1]
            continue
        run = _uvx_run(line)
        if run is False:
            return None
        if isinstance(run, UvxRun):
            runs.append(run)
    if version is None or not runs:
        return None
    return VerifierProvision(uv_version=version, runs=tuple(runs))


def rewrite_test_sh(test_sh: str) -> str:
    """``test_sh`` with the installer and its apt lines turned into ``:`` no-ops."""
    out = []
    for line in test_sh.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        if _INSTALLER_RE.match(body) or _APT_RE.match(body):
            ending = line[len(body) :]
            out.append(
                f": llenvs-async provisioned this at build time: {shlex.quote(body)}{ending}"
            )
        else:
            out.append(line)
    return "".join(out)


def _last_user(dockerfile: str) -> str | None:
    users = re.findall(r"^\s*USER\s+(\S+)\s*$", dockerfile, re.IGNORECASE | re.MULTILINE)
    return users[-1] if users else None


def provision_dockerfile(
    dockerfile: str, provision: VerifierProvision, *, index_url: str | None = None
) -> str:
    """``dockerfile`` with a uv download stage before its last ``FROM`` and the provisioning
    steps at the end (run as root; the task's last ``USER`` restored after them);
    ``index_url``: the package index both downloads use (default: pip's and uv's own)."""
    pip_index = f"--index-url {shlex.quote(index_url)} " if index_url else ""
    uv_index = f"UV_DEFAULT_INDEX={shlex.quote(index_url)} " if index_url else ""
    stage = (
        f"FROM {_STAGE_IMAGE} AS {_STAGE}\n"
        f"RUN python3 -m pip download {pip_index}--no-deps --only-binary=:all: -d /w "
        f"uv=={provision.uv_version}"
        " && python3 -m zipfile -e /w/uv-*.whl /x"
        " && mkdir /out && cp /x/uv-*.data/scripts/uv /x/uv-*.data/scripts/uvx /out/"
        " && chmod 755 /out/uv /out/uvx\n"
    )
    warm = " && ".join(uv_index + _warm_command(run) for run in provision.runs)
    tail = [
        "USER root",
        f"COPY --from={_STAGE} /out/ /usr/local/bin/",
        f"ENV UV_CACHE_DIR={UV_CACHE_DIR} UV_PYTHON_INSTALL_DIR={_UV_PYTHON_DIR}",
        "RUN mkdir -p /root/.local/bin && ln -sf /usr/local/bin/uv /usr/local/bin/uvx "
        f"/root/.local/bin/ && printf '{_ENV_FILE}' > /root/.local/bin/env && {warm} "
        "&& chmod -R a+rwX /opt/llenvs-uv",
    ]
    user = _last_user(dockerfile)
    if user is not None and user not in ("root", "0"):
        tail.append(f"USER {user}")
    lines = dockerfile.rstrip("\n").split("\n")
    last_from = max(i for i, line in enumerate(lines) if _FROM_RE.match(line))
    lines.insert(last_from, stage.rstrip("\n"))
    return "\n".join([*lines, *tail]) + "\n"


def _warm_command(run: UvxRun) -> str:
    """The uvx run with ``--version`` for arguments: resolves and caches what it needs."""
    python = f"-p {shlex.quote(run.python)} " if run.python else ""
    packages = "".join(f"--with {shlex.quote(p)} " for p in run.with_packages)
    return f"uvx {python}{packages}{shlex.quote(run.tool)} --version"


def offline_test_sh(
    test_sh: str, *, index_url: str | None = None
) -> tuple[str, dict[str, str]] | None:
    """For a recognised ``test_sh`` (whose image was provisioned): the script to upload and
    the verifier's extra environment (``UV_OFFLINE=1``, and the build's ``index_url``, whose
    cached pages uv reads offline); ``None`` leaves it untouched."""
    if detect_provision(test_sh) is None:
        return None
    env = {"UV_OFFLINE": "1"} | ({"UV_DEFAULT_INDEX": index_url} if index_url else {})
    return rewrite_test_sh(test_sh), env
