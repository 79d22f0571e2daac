"""What a fresh shell re-applies of another's (``ShellState``: a fork from a commit keeps the
filesystem only), and the read-only probes that capture it."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ..errors import RestoreError
from ._shell import ShellSession

__all__ = ["ShellState", "apply_shell_state", "capture_shell_state", "run_probe"]

_PROBE_TIMEOUT = 30.0
_SEPARATOR = "__llenvs_shell_state__"
# Per-container or owned by our ShellSession: never carried from the replayed shell.
_NOT_CARRIED = frozenset({"HOSTNAME", "PS1", "PS2"})
_CAPTURE = (
    f"pwd; echo {_SEPARATOR}; umask; echo {_SEPARATOR}; (unset {' '.join(sorted(_NOT_CARRIED))}; "
    "export -p)"
)
_EXPORT_RE = re.compile(r"^(?:declare -\S+|export) ([A-Za-z_][A-Za-z0-9_]*)(?:=|$)", re.M)
_UMASK_RE = re.compile(r"^[0-7]{1,4}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellState:
    """What a commit does not keep of the replayed shell and forks re-apply."""

    cwd: str
    umask: str
    exports: str

    @property
    def exported(self) -> frozenset[str]:
        return frozenset(_EXPORT_RE.findall(self.exports))


async def run_probe(shell: ShellSession, command: str, what: str) -> str:
    """``command``'s output, or ``RestoreError`` when it fails or its output is cut."""
    result = await shell.run(command, timeout=_PROBE_TIMEOUT)
    if not result.ok or result.truncated_bytes:
        raise RestoreError(f"{what} failed (exit code {result.exit_code}): {result.output[:300]!r}")
    return result.output


async def capture_shell_state(shell: ShellSession) -> ShellState | str:
    """The replayed shell's cwd, umask and exports, or why they cannot be carried over."""
    parts = (await run_probe(shell, _CAPTURE, "capturing the shell state")).split(
        f"\n{_SEPARATOR}\n"
    )
    if len(parts) != 3 or not _UMASK_RE.match(parts[1]):
        return f"the shell state could not be parsed: {parts[:2]!r}"
    return ShellState(cwd=parts[0], umask=parts[1], exports=parts[2].rstrip("\n"))


async def apply_shell_state(shell: ShellSession, saved: ShellState) -> None:
    """Re-apply ``saved`` in a fresh shell: cwd, umask, and exactly the saved exports."""
    fresh = await run_probe(
        shell, f"cd -- {shlex.quote(saved.cwd)} && umask {saved.umask} && export -p", "cd/umask"
    )
    extra = sorted(frozenset(_EXPORT_RE.findall(fresh)) - saved.exported - _NOT_CARRIED)
    unset = f"unset -v {' '.join(extra)}\n" if extra else ""
    await run_probe(shell, unset + saved.exports, "re-applying the exported variables")
