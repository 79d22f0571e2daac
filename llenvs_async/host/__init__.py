"""The host layer: ``Host``, the base of every box a command runs in (a Docker container, a
gVisor sandbox), with exec, the process-tree kill and the output drain written once; the
persistent shell session, which runs over any host's channel (``ShellSession``, its wire
protocol and framing, the shell state a fork re-applies); and what hosts share: command
results and capped output, the pid-marking exec wrapper, the kill-tree script, the tar that
``put_files`` sends."""

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
from ._shell import ShellSession
from ._shell_channel import ChannelMessage, ShellChannel, ShellHost, ShellKind, ShellSnapshot
from ._shell_state import ShellState, apply_shell_state, capture_shell_state, run_probe

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "KILLED_DRAIN_TIMEOUT",
    "KILL_TREE_SCRIPT",
    "SIGNAL_TIMEOUT",
    "UPTIME_TICKS",
    "Capability",
    "CappedOutput",
    "ChannelMessage",
    "Carrier",
    "CommandResult",
    "Host",
    "PidMark",
    "ShellChannel",
    "ShellHost",
    "ShellKind",
    "ShellSession",
    "ShellSnapshot",
    "ShellState",
    "apply_shell_state",
    "capture_shell_state",
    "command_result",
    "files_tar",
    "kill_tree_argv",
    "kill_tree_count",
    "pid_marked",
    "run_probe",
    "shell_command",
]
