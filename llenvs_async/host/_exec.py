"""What ``Container`` and ``Sandbox`` execs share, whatever carries them: the pid-marking
wrapper and its parser, the kill-tree command line, the tar for ``put_files``, the result."""

from __future__ import annotations

import io
import math
import tarfile
import time
from collections.abc import Mapping, Sequence
from typing import Literal

from ._output import CappedOutput, CommandResult

__all__ = [
    "KILL_TREE_SCRIPT",
    "UPTIME_TICKS",
    "PidMark",
    "command_result",
    "files_tar",
    "kill_tree_argv",
    "kill_tree_count",
    "pid_marked",
    "shell_command",
]

_PID_MARK = b"__llenvs_pid__"

# Signals a process tree from a second exec, using only shell builtins (it must work even
# when the pids limit is exhausted). Args: SIGNAL ROOT KEEP_ROOT(0/1) MIN_AGE_TICKS(-: all).
# Targets ROOT and those of its process group and descendants started at most MIN_AGE_TICKS
# ago; KILL repeats until nothing is left (fork bombs). Prints how many signals were sent.
# ``up`` (seconds as /proc/uptime prints them, two decimals) in clock ticks: without its
# leading zeros, or a young sandbox's "0.08" is the invalid octal 008 (gVisor's uptime
# starts at 0 with the sandbox).
UPTIME_TICKS = r"""up=${up%.*}${up#*.}; while [ "${up#0}" != "$up" ]; do up=${up#0}; done
up=${up:-0}"""
KILL_TREE_SCRIPT = (
    r"""
sig=$1 root=$2 keep=$3 age=$4 self=$$ pg=$2 min=0 total=0 rounds=0
if read -r l 2>/dev/null </proc/$root/stat; then set -- ${l##*)}; pg=$3; fi
if [ "$age" != - ]; then
  read -r up _ </proc/uptime
  """
    + UPTIME_TICKS
    + r"""
  min=$((up - age))
fi
while [ $rounds -lt 100 ]; do
  rounds=$((rounds + 1)) tree=" $root " more=1 hit=0
  while [ $more = 1 ]; do
    more=0
    for d in /proc/[0-9]*; do
      p=${d#/proc/}
      case $tree in *" $p "*) continue ;; esac
      read -r l 2>/dev/null <$d/stat || continue
      set -- ${l##*)}
      case $tree in *" $2 "*) tree="$tree$p " more=1; continue ;; esac
      if [ "$3" = "$pg" ]; then tree="$tree$p " more=1; fi
    done
  done
  for p in $tree; do
    [ "$p" = "$self" ] && continue
    [ "$keep" = 1 ] && [ "$p" = "$root" ] && continue
    read -r l 2>/dev/null </proc/$p/stat || continue
    set -- ${l##*)}
    [ "$1" = Z ] && continue
    [ "$p" != "$root" ] && [ "${20}" -lt "$min" ] && continue
    kill -$sig $p 2>/dev/null && hit=$((hit + 1))
  done
  total=$((total + hit))
  [ "$sig" = KILL ] && [ $hit -gt 0 ] || break
done
echo $total
"""
)


def shell_command(argv: str | Sequence[str]) -> list[str]:
    """``argv`` as a list (a string runs under ``/bin/sh -c``); never empty."""
    command = ["/bin/sh", "-c", argv] if isinstance(argv, str) else list(argv)
    if not command:
        raise ValueError("exec needs a non-empty argv")
    return command


def pid_marked(command: Sequence[str]) -> list[str]:
    """``command`` behind a wrapper whose first stdout line is its pid (see ``PidMark``)."""
    return ["/bin/sh", "-c", f'printf "{_PID_MARK.decode()}%d\\n" $$; exec "$@"', "sh", *command]


class PidMark:
    """Splits the pid line of ``pid_marked`` off the start of a stdout stream."""

    __slots__ = ("_head", "pid")

    def __init__(self) -> None:
        self._head = bytearray()
        self.pid: int | None = None
        """The marked pid once its line is read (0: the first line was no mark)."""

    def feed(self, data: bytes) -> bytes:
        """The output in ``data``: held back until the first line is complete, less the mark."""
        if self.pid is not None:
            return data
        self._head += data
        line, newline, rest = self._head.partition(b"\n")
        if not newline:
            return b""
        value = line[len(_PID_MARK) :]
        if line.startswith(_PID_MARK) and value.isdigit():
            self.pid, data = int(value), bytes(rest)
        else:
            self.pid, data = 0, bytes(self._head)
        self._head.clear()
        return data

    def flush(self) -> bytes:
        """What is still held back (the stream ended within its first line)."""
        data = bytes(self._head)
        self._head.clear()
        return data


def kill_tree_argv(
    signal: Literal["INT", "TERM", "KILL"],
    root_pid: int,
    *,
    keep_root: bool = False,
    max_age_s: float | None = None,
) -> list[str]:
    """The command line of ``KILL_TREE_SCRIPT`` (``max_age_s`` in clock ticks, with slack)."""
    age = "-" if max_age_s is None else str(math.ceil(max_age_s * 100) + 50)
    return ["/bin/sh", "-c", KILL_TREE_SCRIPT, "llenvs-kill", signal, str(root_pid),
            "1" if keep_root else "0", age]  # fmt: skip


def kill_tree_count(output: str) -> int:
    """How many signals ``KILL_TREE_SCRIPT`` reported sending (0 if it printed no count)."""
    text = output.strip()
    return int(text) if text.isdigit() else 0


def files_tar(files: Mapping[str, bytes | str], *, mode: int) -> bytes:
    """An uncompressed tar of ``files`` (absolute paths, members rooted at ``/``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, content in files.items():
            if not path.startswith("/"):
                raise ValueError(f"put_files needs absolute paths, got {path!r}")
            data = content.encode() if isinstance(content, str) else content
            member = tarfile.TarInfo(path.lstrip("/"))
            member.size, member.mode, member.mtime = len(data), mode, int(time.time())
            tar.addfile(member, io.BytesIO(data))
    return buf.getvalue()


def command_result(
    out: CappedOutput, *, exit_code: int | None, timed_out: bool, started: float
) -> CommandResult:
    """The result of an exec begun at ``started`` (``time.monotonic()``)."""
    return CommandResult(
        output=out.text(),
        exit_code=exit_code,
        timed_out=timed_out,
        truncated_bytes=out.truncated_bytes,
        duration_s=time.monotonic() - started,
    )
