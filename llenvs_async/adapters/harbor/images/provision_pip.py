"""The ``pip install`` verifier shape ``provision_verifier`` recognises in ``tests/test.sh``.

One logical line (``\\``-continued lines joined) that is a list of commands joined by
``||``, ``&&`` or ``;``, each one ``pip``/``pip3``/``pip3.X``/``python[3[.X]] -m pip``
``install`` with options and **pinned** requirements (``pytest==8.4.1``,
``'pytest-json-ctrf[x]==0.3.5'``), its output optionally sent to ``/dev/null``; a last
``|| true`` (``|| :``) is allowed. So ``pip install -q pytest==8.2.2 2>/dev/null ||
pip install --break-system-packages pytest==8.2.2`` is one shape: at build time the same
chain runs (without redirections or ``|| true``, so a failure fails the build).

Options are taken as written, with or without a value (``--timeout 60``, ``-q``), except
those that fetch from elsewhere or install elsewhere than the verifier looks: files
(``-r``, ``-c``, ``-e``), other indexes (``-i``, ``--index-url``, ``--extra-index-url``,
``-f``) and ``--user``. Unpinned or ranged requirements (what a build would freeze into a
cached image is then a guess), URLs and paths are not this shape either; a line with them,
or with any other command beside a ``pip install`` (``cd /app && pip install ...``), leaves
the whole script untouched.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

__all__ = ["PipInstall", "PipLine", "pip_install"]

_PIP_RE = re.compile(r"^pip(?:3(?:\.\d+)?)?$")
_PYTHON_RE = re.compile(r"^python(?:3(?:\.(\d+))?)?$")
_PIP_VERSION_RE = re.compile(r"^pip3\.(\d+)$")
# Options that fetch from elsewhere, or install where the verifier may not look.
_REFUSED = frozenset(
    {"-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url",
     "--extra-index-url", "-f", "--find-links", "--user"}
)  # fmt: skip
# pip install's options that take a value as the next word.
_VALUE_FLAGS = frozenset(
    {"--progress-bar", "--root-user-action", "--timeout", "--retries", "-t", "--target",
     "--prefix", "--root", "--cache-dir", "--src", "--upgrade-strategy", "--platform",
     "--python-version", "--implementation", "--abi", "--only-binary", "--no-binary",
     "-C", "--config-settings", "--global-option", "--log", "--trusted-host",
     "--report", "--exists-action", "--proxy", "--cert", "--client-cert"}
)  # fmt: skip
_REQUIREMENT_RE = re.compile(  # pinned: name[extras]==version (no wildcard)
    r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,-]+\])?===?[A-Za-z0-9.+!_-]+$"
)
_REDIRECT_RE = re.compile(r"^(?:[12&]?>>?)(?:/dev/null|&[12])?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class PipInstall:
    """One recognised ``pip install`` command: the command as written up to ``install``
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

    @property
    def interpreter(self) -> str:
        """The Python that runs it (``pip3.12``: ``python3.12``; ``pip``: ``python3``)."""
        if len(self.command) == 3:
            return self.command[0]
        return f"python{self.python}" if self.python else "python3"

    def shell(self) -> str:
        """The install as one shell command, without its redirections."""
        return " ".join(shlex.quote(w) for w in (*self.command, "install", *self.options,
                                                  *self.requirements))  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class PipLine:
    """A recognised line: its installs and the operators between them (``"||"``, ``"&&"``;
    a ``;`` is taken as ``&&``: at build time every one must hold)."""

    installs: tuple[PipInstall, ...]
    operators: tuple[str, ...]

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r for i in self.installs for r in i.requirements))

    def shell(self) -> str:
        """The line as the build runs it: the installs and their operators, nothing else."""
        words = [self.installs[0].shell()]
        for operator, install in zip(self.operators, self.installs[1:], strict=True):
            words += [operator, install.shell()]
        return " ".join(words)


def _command(words: list[str]) -> tuple[str, ...] | None:
    if words and _PIP_RE.match(words[0]):
        return (words[0],)
    if len(words) >= 3 and _PYTHON_RE.match(words[0]) and words[1:3] == ["-m", "pip"]:
        return tuple(words[:3])
    return None


def _redirects_only(tail: list[str]) -> bool:
    """Only output sent to ``/dev/null`` (or to the other stream)."""
    while tail:
        word = tail.pop(0)
        if not _REDIRECT_RE.match(word):
            return False
        if word.endswith(">") and (not tail or tail.pop(0) != "/dev/null"):
            return False
    return True


def _segments(line: str) -> list[tuple[str, str]] | None:
    """``line`` split at ``||``, ``&&`` and ``;`` outside quotes: ``(operator before, text)``
    pairs; ``None`` for a pipe or a background ``&`` (not this shape)."""
    out: list[tuple[str, str]] = []
    operator, buf, quote, i = "", "", "", 0
    while i < len(line):
        c = line[i]
        if quote:
            buf += c
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"' and i + 1 < len(line):
                buf, i = buf + line[i + 1], i + 1
        elif c in "'\"":
            quote, buf = c, buf + c
        elif c == "\\" and i + 1 < len(line):
            buf, i = buf + c + line[i + 1], i + 1
        elif line.startswith(("&&", "||"), i):
            out.append((operator, buf))
            operator, buf, i = line[i : i + 2], "", i + 1
        elif c == ";":
            out.append((operator, buf))
            operator, buf = ";", ""
        elif c == "|" or (c == "&" and ">" not in (line[i - 1 : i], line[i + 1 : i + 2])):
            return None  # a pipe, or a job put in the background (not `2>&1`, `&>`)
        else:
            buf += c
        i += 1
    out.append((operator, buf))
    return out


def _one(text: str) -> PipInstall | bool | None:
    """One command: a recognised install, ``False`` for a ``pip install`` of another shape,
    ``None`` for anything else."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None if "pip" not in text else False
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
    while rest and not _REDIRECT_RE.match(rest[0]):
        word = rest.pop(0)
        flag = word.partition("=")[0]
        if flag in _REFUSED:
            return False
        if word.startswith("-"):
            options.append(word)
            if word in _VALUE_FLAGS and rest:
                options.append(rest.pop(0))
        elif _REQUIREMENT_RE.match(word):
            requirements.append(word)
        else:
            return False
    if not requirements or not _redirects_only(rest):
        return False
    return PipInstall(command=command, options=tuple(options), requirements=tuple(requirements))


def pip_install(line: str) -> PipLine | bool | None:
    """``line`` parsed; ``None``: it does not run ``pip install``; ``False``: it does, in a
    way this shape does not cover (the script is then left alone)."""
    segments = _segments(line)
    if segments is None:
        return False if re.search(r"\bpip\S*\s+install\b", line) else None
    if len(segments) > 1 and segments[-1][0] == "||" and segments[-1][1].strip() in ("true", ":"):
        segments = segments[:-1]  # a last `|| true`: the build drops it
    parsed = [(operator, _one(text)) for operator, text in segments]
    installs = [p for _, p in parsed if isinstance(p, PipInstall)]
    if not installs:
        return False if any(p is False for _, p in parsed) else None
    if len(installs) != len(parsed):
        return False  # another command beside the install(s)
    operators = tuple("&&" if op == ";" else op for op, _ in parsed[1:])
    return PipLine(installs=tuple(installs), operators=operators)
