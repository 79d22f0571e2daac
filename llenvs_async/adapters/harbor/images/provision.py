"""``provision_verifier``: what the common verifiers fetch at test time, fetched at build time
instead, so the verifier runs offline (and no verification downloads it again).

Two shapes are recognised in ``tests/test.sh`` (after joining ``\\``-continued lines), alone
or together, and nothing else. ``pip install`` lines of pinned requirements
(``provision_pip.py``: ``pip``/``pip3``/``python -m pip`` with any options but other
sources, alone or in ``||``/``&&`` chains, ``2>/dev/null || true`` allowed),
any line that runs ``pip install`` otherwise leaving the whole script untouched. The uv shape:

- the installer, exactly ``curl <flags> https://astral.sh/uv/<X.Y.Z>/install.sh | sh``
  (or ``| bash``; ``wget -qO- <url> | sh`` too), with a pinned version: it is REQUIRED;
- ``uvx`` runs of ``pytest`` whose only options are ``-p``/``--python VER`` and
  ``-w``/``--with PKG`` (``=`` forms too), e.g. ``uvx -p 3.13 -w pytest==8.4.1
  -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py``;
  any other ``uvx`` option or tool, or any other line naming ``uvx`` (e.g.
  ``command -v uvx``), leaves the whole script untouched;
- ``apt-get update`` and ``apt-get install [-y|-qq|--no-install-recommends] curl`` lines
  (they only serve the installer).

When a script matches, the task image gets (after the task's own Dockerfile, as root): pip
for each interpreter the ``pip install`` lines use that has none (from pip's wheel, fetched
in a ``python:3`` stage and run as a zip: an image with ``python3`` but not ``python3-pip``),
each recognised ``pip install`` line run as written (same interpreters, options,
requirements and ``||``/``&&`` chain), then
``uv==X`` from PyPI (``pip download`` in a ``python:3`` stage; the ``uv``/``uvx`` binaries
copied to ``/usr/local/bin``, ``$HOME/.local/bin/env`` as the installer writes it), then
each recognised ``uvx`` command run once with ``pytest --version`` so its packages (and
its Python, when uv can download it) sit in ``/opt/llenvs-uv``'s cache. At test time the
installer, apt and ``pip install`` lines become ``:`` no-ops (commented with what they were)
and a uv verifier runs with ``UV_OFFLINE=1``. It needs a build network (``build_network``).
``index_url`` (``provision_index_url``) points both downloads at another package index
(a PEP 503 ``/simple`` URL, e.g. a mirror on 127.0.0.1): used by the build, and named
(offline) to the verifier, since uv keys its cached index pages on the index URL. Every
provisioning step prints ``PROVISION_MARK`` and the image's Python first, so a failed build
can say it was this step and which Python the image has (``provision_hint``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from .provision_pip import PipInstall, PipLine, pip_install

__all__ = [
    "PROVISION_MARK",
    "UV_CACHE_DIR",
    "PipInstall",
    "PipLine",
    "VerifierProvision",
    "detect_provision",
    "offline_test_sh",
    "provision_dockerfile",
    "provision_hint",
    "rewrite_test_sh",
]

UV_CACHE_DIR = "/opt/llenvs-uv/cache"
PROVISION_MARK = "llenvs-async --provision-verifier"
_UV_PYTHON_DIR = "/opt/llenvs-uv/python"
_STAGE = "llenvs-uv-provision"
_PIP_STAGE = "llenvs-pip-provision"
_PIP_WHEEL_DIR = "/opt/llenvs-pip"
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
# Printed first by every provisioning step: what a failed build's log is searched for.
_SAY_PYTHON = (
    f'echo "{PROVISION_MARK}: the image has '
    "$( (python3 -V || python -V) 2>&1 | grep -m1 '^Python' || echo 'no python3')\""
)
_IMAGE_PYTHON_RE = re.compile(rf"{re.escape(PROVISION_MARK)}: the image has Python (\d+\.\d+)")
_STEP_RE = re.compile(r"^Step \d+/\d+ : ")
_PIP_ENV = "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_CACHE_DIR=1"


@dataclass(frozen=True, slots=True, kw_only=True)
class UvxRun:
    """One recognised ``uvx`` run: its Python request and its ``--with`` packages."""

    python: str | None
    with_packages: tuple[str, ...]
    tool: str


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierProvision:
    """What a recognised ``test.sh`` fetches: uv at ``uv_version`` and its ``uvx`` runs
    (``None``/empty without the uv shape), and its ``pip install`` lines."""

    uv_version: str | None = None
    runs: tuple[UvxRun, ...] = ()
    pip: tuple[PipLine, ...] = ()

    @property
    def pythons(self) -> tuple[str, ...]:
        """The Python versions it asks for (``uvx -p``, ``python3.X -m pip``), in order."""
        asked = [r.python for r in self.runs] + [i.python for p in self.pip for i in p.installs]
        return tuple(dict.fromkeys(v for v in asked if v is not None))


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
    """The provisioning ``test_sh`` needs, or ``None`` when it does not match a recognised
    shape exactly (see the module docstring)."""
    version: str | None = None
    runs: list[UvxRun] = []
    pips: list[PipLine] = []
    for line in _logical_lines(test_sh):
        if match := _INSTALLER_RE.match(line):
            version = match[1]
            continue
        run = _uvx_run(line)
        pip = pip_install(line)
        if run is False or pip is False:
            return None
        if isinstance(run, UvxRun):
            runs.append(run)
        if isinstance(pip, PipLine):
            pips.append(pip)
    if (version is None) != (not runs) or not (runs or pips):
        return None  # half a uv shape (an installer without uvx, or uvx without it)
    return VerifierProvision(uv_version=version, runs=tuple(runs), pip=tuple(pips))


def rewrite_test_sh(test_sh: str) -> str:
    """``test_sh`` with the uv installer and its apt lines, and recognised ``pip install``
    lines, turned into ``:`` no-ops (continued lines blanked: line numbers still match)."""
    uv = detect_provision(test_sh)
    with_uv = uv is not None and bool(uv.runs)
    out: list[str] = []
    pending: list[str] = []
    for line in test_sh.splitlines(keepends=True):
        pending.append(line)
        body = line.rstrip("\r\n")
        if body.endswith("\\"):
            continue
        logical = " ".join(p.rstrip("\r\n").removesuffix("\\") for p in pending)
        uv_line = with_uv and bool(_INSTALLER_RE.match(logical) or _APT_RE.match(logical))
        if uv_line or isinstance(pip_install(logical), PipLine):
            ending = line[len(body) :]
            no_op = f": llenvs-async provisioned this at build time: {shlex.quote(logical)}"
            out += [no_op + ending, *(ending for _ in pending[1:])]
        else:
            out += pending
        pending = []
    return "".join(out + pending)


def _last_user(dockerfile: str) -> str | None:
    users = re.findall(r"^\s*USER\s+(\S+)\s*$", dockerfile, re.IGNORECASE | re.MULTILINE)
    return users[-1] if users else None


def provision_dockerfile(
    dockerfile: str, provision: VerifierProvision, *, index_url: str | None = None
) -> str:
    """``dockerfile`` with the provisioning steps at the end (run as root; the task's last
    ``USER`` restored after them) and, for uv, a download stage before its last ``FROM``;
    ``index_url``: the package index every download uses (default: pip's and uv's own)."""
    pip_index = f"--index-url {shlex.quote(index_url)} " if index_url else ""
    tail = ["USER root"]
    stages: list[str] = []
    if provision.pip:
        env = _PIP_ENV + (f" PIP_INDEX_URL={shlex.quote(index_url)}" if index_url else "")
        pythons = dict.fromkeys(i.interpreter for line in provision.pip for i in line.installs)
        ensure = " && ".join(_ensure_pip(python) for python in pythons)
        installs = " && ".join(f"( {line.shell()} )" for line in provision.pip)
        stages.append(
            f"FROM {_STAGE_IMAGE} AS {_PIP_STAGE}\n"
            f"RUN echo '{PROVISION_MARK}: pip' && python3 -m pip download {pip_index}--no-deps "
            "--only-binary=:all: -d /w pip"
        )
        tail += [
            f"COPY --from={_PIP_STAGE} /w/ {_PIP_WHEEL_DIR}/",
            f"RUN {_SAY_PYTHON} && export {env} && {ensure} && {installs}",
        ]
    lines = dockerfile.rstrip("\n").split("\n")
    if provision.uv_version is not None:
        uv_index = f"UV_DEFAULT_INDEX={shlex.quote(index_url)} " if index_url else ""
        stage = (
            f"FROM {_STAGE_IMAGE} AS {_STAGE}\n"
            f"RUN echo '{PROVISION_MARK}: uv' && python3 -m pip download {pip_index}--no-deps "
            f"--only-binary=:all: -d /w uv=={provision.uv_version}"
            " && python3 -m zipfile -e /w/uv-*.whl /x"
            " && mkdir /out && cp /x/uv-*.data/scripts/uv /x/uv-*.data/scripts/uvx /out/"
            " && chmod 755 /out/uv /out/uvx"
        )
        warm = " && ".join(uv_index + _warm_command(run) for run in provision.runs)
        tail += [
            f"COPY --from={_STAGE} /out/ /usr/local/bin/",
            f"ENV UV_CACHE_DIR={UV_CACHE_DIR} UV_PYTHON_INSTALL_DIR={_UV_PYTHON_DIR}",
            f"RUN {_SAY_PYTHON} && mkdir -p /root/.local/bin && ln -sf /usr/local/bin/uv "
            f"/usr/local/bin/uvx /root/.local/bin/ && printf '{_ENV_FILE}' > "
            f"/root/.local/bin/env && {warm} && chmod -R a+rwX /opt/llenvs-uv",
        ]
        stages.append(stage)
    if stages:
        last_from = max(i for i, line in enumerate(lines) if _FROM_RE.match(line))
        lines[last_from:last_from] = stages
    user = _last_user(dockerfile)
    if user is not None and user not in ("root", "0"):
        tail.append(f"USER {user}")
    return "\n".join([*lines, *tail]) + "\n"


def _ensure_pip(python: str) -> str:
    """Give ``python`` pip from the wheel the pip stage fetched, only when it has none (an
    image with ``python3`` but not ``python3-pip``), saying so in the build log."""
    wheel = f"{_PIP_WHEEL_DIR}/pip-*.whl"
    return (
        f"{{ {python} -m pip --version >/dev/null 2>&1 || {{ echo '{PROVISION_MARK}: "
        f'{python} has no pip: installing it from its wheel\'; {python} "$(echo {wheel})/pip" '
        f"install --no-index --break-system-packages {wheel}; }}; }}"
    )


def _warm_command(run: UvxRun) -> str:
    """The uvx run with ``--version`` for arguments: resolves and caches what it needs."""
    python = f"-p {shlex.quote(run.python)} " if run.python else ""
    packages = "".join(f"--with {shlex.quote(p)} " for p in run.with_packages)
    return f"uvx {python}{packages}{shlex.quote(run.tool)} --version"


def offline_test_sh(
    test_sh: str, *, index_url: str | None = None
) -> tuple[str, dict[str, str]] | None:
    """For a recognised ``test_sh`` (whose image was provisioned): the script to upload and
    the verifier's extra environment (for uv: ``UV_OFFLINE=1``, and the build's
    ``index_url``, whose cached pages uv reads offline); ``None`` leaves it untouched."""
    found = detect_provision(test_sh)
    if found is None:
        return None
    env: dict[str, str] = {}
    if found.runs:
        env = {"UV_OFFLINE": "1"} | ({"UV_DEFAULT_INDEX": index_url} if index_url else {})
    return rewrite_test_sh(test_sh), env


def provision_hint(
    log: Sequence[str],
    provision: VerifierProvision,
    *,
    base: str,
    standin: tuple[str, str | None] | None = None,
) -> str | None:
    """Why a build failed in a provisioning step (``None``: it failed elsewhere): which
    step, the Python ``test.sh`` asks for and the one the image has (``base``: its last
    ``FROM`` as written; ``standin``: the local stand-in used for it and its Python), and
    what to do."""
    steps = [line for line in log if _STEP_RE.match(line)]
    if not steps or not any(mark in steps[-1] for mark in (PROVISION_MARK, _STAGE, _PIP_STAGE)):
        return None
    said = [m[1] for line in log if (m := _IMAGE_PYTHON_RE.search(line))]
    has = said[-1] if said else (standin[1] if standin else None)
    where = f"the stand-in {standin[0]} for {base}" if standin else base
    hint = (
        "the failing step is --provision-verifier's (HarborAdapter(provision_verifier=True)), "
        "which installs at build time what tests/test.sh would download at test time"
    )
    wrong = [v for v in provision.pythons if has is not None and v != has]
    if wrong:
        asked = ", ".join(wrong)
        hint += (
            f": test.sh asks for Python {asked} but {where} has Python {has}, so a Python "
            f"{asked} had to come from elsewhere (uv downloads CPython from GitHub) and that "
            f"failed here; map {base} to a local image with Python {asked} "
            f"(--base-image '{base}=IMAGE'), or leave out "
            "--provision-verifier for this task (its verifier then needs the internet)"
        )
    else:
        hint += (
            f" ({where} has Python {has or 'unknown'}); the build log above says what it "
            "could not fetch: point --provision-index-url at an index that has it, or leave "
            "out --provision-verifier for this task"
        )
    return hint
