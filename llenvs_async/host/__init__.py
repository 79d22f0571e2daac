"""The host layer: ``Host``, the base of every box a command runs in (a Docker container, a
gVisor sandbox), with exec, the process-tree kill and the output drain written once; and
what they share: command results and capped output, the pid-marking exec wrapper, the
kill-tree script, the tar that ``put_files`` sends."""

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
from ._host import KILLED_DRAIN_TIMEOUT, SIGNAL_TIMEOUT, Capability, Carrier, Host
from ._output import DEFAULT_MAX_OUTPUT_BYTES, CappedOutput, CommandResult

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "KILLED_DRAIN_TIMEOUT",
    "KILL_TREE_SCRIPT",
    "SIGNAL_TIMEOUT",
    "UPTIME_TICKS",
    "Capability",
    "CappedOutput",
    "Carrier",
    "CommandResult",
    "Host",
    "PidMark",
    "command_result",
    "files_tar",
    "kill_tree_argv",
    "kill_tree_count",
    "pid_marked",
    "shell_command",
]
