"""The ``pip install`` verifier shape ``provision_verifier`` recognises in ``tests/test.sh``.

One logical line that is exactly ``pip``/``pip3``/``pip3.X``/``python[3[.X]] -m pip``,
``install``, options from a short list that change nothing but output and the system-package
guard (``-q``, ``--no-cache-dir``, ``--break-system-packages``, ``-U``, ...), then pinned
requirements (``pytest==8.4.1``, ``'pytest-json-ctrf[x]==0.3.5'``), then optionally output
redirected to ``/dev/null`` and ``|| true``. Unpinned or ranged requirements (what a build
would freeze into a cached image is then a guess), files (``-r``), URLs, paths, other
indexes and ``--user`` are not this shape.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

__all__ = ["PipInstall", "pip_install"]

_PIP_RE = re.compile(r"^pip(?:3(?:\.\d+)?)?$")
_PYTHON_RE = re.compile(r"^python(?:3(?:\.(\d+))?)?$")
_PIP_VERSION_RE = re.compile(r"^pip3\.(\d+)$")
_FLAGS = frozenset(
    {
        "-q", "-qq", "-qqq", "--quiet", "-v", "--verbose", "--no-cache-dir", "-U", "--upgrade",
        "--break-system-packages", "--disable-pip-version-check", "--no-input",
        "--no-warn-script-location", "--no-color", "--progress-bar=off",
        "--root-user-action=ignore", "--prefer-binary", "--only-binary=:all:",
    }
)  # fmt: skip
_VALUE_FLAGS = frozenset({"--progress-bar", "--root-user-action"})
_REQUIREMENT_RE = re.compile(  # pinned: name[extras]==version (no wildcard)
    r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,-]+\])?===?[A-Za-z0-9.+!_-]+$"
)
_REDIRECT_RE = re.compile(r"^(?:[12&]?>>?)(?:/dev/null|&[12])?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class PipInstall:
    """One recognised ``pip install`` line: the command as written up to ``install``
    (``("pip3",)``, ``("python3.12", "-m", "pip")``), its options and its requirements."""

    command: tuple[str, ...]
    options: tuple[str, ...]
    requirements: tuple[str, ...]

    @property
    def python(self) -> str | None:
        """The Python version its interpreter names (``python3.12``, ``pip3.12``), if any."""
        head = self.command[0]
        match = _PYTHON_RE.match(head)
        minor = match[1] if match else (m[1] if (m := _PIP_VERSION_RE.match(head)) else None)
        return f"3.{minor}" if minor else None

    def shell(self) -> str:
        """The install as one shell command, without its redirections and ``|| true``."""
        return " ".join(shlex.quote(w) for w in (*self.command, "install", *self.options,
                                                  *self.requirements))  # fmt: skip


def _command(words: list[str]) -> tuple[str, ...] | None:
    if words and _PIP_RE.match(words[0]):
        return (words[0],)
    if len(words) >= 3 and _PYTHON_RE.match(words[0]) and words[1:3] == ["-m", "pip"]:
        return tuple(words[:3])
    return None


def _tail_ok(tail: list[str]) -> bool:
    """Only output sent to ``/dev/null`` and a final ``|| true`` (``|| :``)."""
    if tail[-2:] in (["||", "true"], ["||", ":"]):
        tail = tail[:-2]
    while tail:
        word = tail.pop(0)
        if not _REDIRECT_RE.match(word):
            return False
        if word.endswith(">") and (not tail or tail.pop(0) != "/dev/null"):
            return False
    return True


def pip_install(line: str) -> PipInstall | bool | None:
    """``line`` parsed; ``None``: it does not run ``pip install``; ``False``: it does, in a
    way this shape does not cover (the script is then left alone)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None if "pip" not in line else False
    command = _command(words)
    if command is None:
        mentions = any(_PIP_RE.match(w) for w in words) and "install" in words
        return False if mentions else None
    rest = words[len(command) :]
    if not rest or rest[0] != "install":
        return None  # pip list, pip --version, ...: nothing to fetch
    options: list[str] = []
    requirements: list[str] = []
    rest = rest[1:]
    while rest and not (_REDIRECT_RE.match(rest[0]) or rest[0] == "||"):
        word = rest.pop(0)
        if word in _VALUE_FLAGS and rest:
            options += [word, rest.pop(0)]
        elif word in _FLAGS:
            options.append(word)
        elif _REQUIREMENT_RE.match(word):
            requirements.append(word)
        else:
            return False
    if not requirements or not _tail_ok(rest):
        return False
    return PipInstall(command=command, options=tuple(options), requirements=tuple(requirements))
