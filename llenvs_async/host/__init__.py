"""What every host a command runs on shares, whatever carries it (a Docker container, a gVisor
sandbox): command results and capped output, the pid-marking exec wrapper, the process-tree
kill, and the tar that ``put_files`` sends."""

from __future__ import annotations

from ._exec import (
    KILL_TREE_SCRIPT,
    UPTIME_TICKS,
    PidMark,
    command_result,
    files_tar,
    kill_tree_argv,
    kill_tree_count,
    pid_marked,
    shell_command,
)
from ._output import DEFAULT_MAX_OUTPUT_BYTES, CappedOutput, CommandResult

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "KILL_TREE_SCRIPT",
    "UPTIME_TICKS",
    "CappedOutput",
    "CommandResult",
    "PidMark",
    "command_result",
    "files_tar",
    "kill_tree_argv",
    "kill_tree_count",
    "pid_marked",
    "shell_command",
]
