"""What agents type into the persistent shell: after each construct the framework's sentinel
still comes back, observations stay clean and ``echo hi`` still says exactly ``hi`` (after
``set -x`` or a DEBUG trap, preceded by what those print for it, as in a terminal).

Each row runs in a fresh shell, bash in the Debian image and, where the construct exists
there, busybox ash. The construct's own observation and exit code are checked exactly, then
``echo hi`` (or the row's ``follow``), then the row's further checks, in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from llenvs_async.docker import CommandResult, ShellSession

from .conftest import ShellFactory

Check = tuple[str, str, int]  # command, exact output, exit code


@dataclass(frozen=True, slots=True)
class Construct:
    """One row: the construct, what it prints itself, and what must hold afterwards."""

    id: str
    command: str
    output: str = ""
    exit_code: int = 0
    follow: Check = ("echo hi", "hi\n", 0)
    then: tuple[Check, ...] = ()
    busybox: bool = True


_VENV = "python3 -m venv --without-pip /tmp/venv && . /tmp/venv/bin/activate"
CONSTRUCTS = [
    # The trace of the command's own commands is what set -x asks for; ours never shows.
    Construct("set -x", "set -x", follow=("echo hi", "+ echo hi\nhi\n", 0)),
    Construct("set -v", "set -v"),
    Construct("set -xv then off", "set -xv; set +xv", output="+ set +xv\n"),
    Construct("PS1", "PS1='$ '"),
    Construct("PS2", "PS2='> '", then=(("echo ok; echo second", "ok\nsecond\n", 0),)),
    Construct("PROMPT_COMMAND", "PROMPT_COMMAND='echo prompt-noise; false'", busybox=False),
    # The DEBUG trap runs before each of the command's own commands (as in a terminal).
    Construct(
        "trap DEBUG",
        "trap 'echo x' DEBUG",
        follow=("echo hi", "x\nhi\n", 0),
        then=(("trap - DEBUG", "x\n", 0), ("echo hi", "hi\n", 0)),
        busybox=False,
    ),
    Construct("trap ERR", "trap 'echo trapped' ERR", then=(("false", "trapped\n", 1),)),
    Construct(
        "source venv/bin/activate",
        _VENV,
        then=(
            ('echo "$VIRTUAL_ENV"; echo "$PS1"', "/tmp/venv\n(venv) \n", 0),
            ("command -v python3", "/tmp/venv/bin/python3\n", 0),
            ('deactivate; echo "[$VIRTUAL_ENV]"', "[]\n", 0),
        ),
        busybox=False,
    ),
    # ``exec`` redirections last for the command that makes them: the output channel
    # cannot be lost for the rest of the session.
    Construct(
        "exec >file",
        "exec >/tmp/out; echo to-file",
        then=(("cat /tmp/out", "to-file\n", 0),),
    ),
    Construct(
        "exec 2>file",
        "exec 2>/tmp/err; cat /no-such-file",
        exit_code=1,
        then=(("grep -c no-such-file /tmp/err", "1\n", 0),),
    ),
    Construct("exec 1>&2", "exec 1>&2; echo via-stderr", output="via-stderr\n"),
    Construct(
        "exec 9>file (the channel is not fd 9)",
        "exec 9>/tmp/lock",
        then=(("echo held >&9; cat /tmp/lock", "held\n", 0),),
    ),
    Construct("set -o pipefail", "set -o pipefail", then=(("false | true", "", 1),)),
    Construct(
        "cd then pushd",
        "mkdir -p /tmp/d && cd /tmp/d && pushd /etc",
        output="/etc /tmp/d\n",
        then=(("pwd; popd >/dev/null; pwd", "/etc\n/tmp/d\n", 0),),
        busybox=False,
    ),
    Construct("cd", "mkdir -p /tmp/d && cd /tmp/d", then=(("pwd", "/tmp/d\n", 0),)),
    # No "[1] 18" when the job starts, no "[1]+ Done" when it ends.
    Construct(
        "background job",
        "sleep 100 &",
        then=(("sleep 0.2 & sleep 0.5; echo waited", "waited\n", 0), ("echo hi", "hi\n", 0)),
    ),
    # Job control without a terminal only adds "[1]+ Done" lines: the framework turns it
    # off after each command (busybox refuses it anyway, saying so).
    Construct(
        "set -m",
        "set -m",
        then=(("sleep 0.2 & sleep 0.5; echo waited", "waited\n", 0), ("jobs", "", 0)),
        busybox=False,
    ),
    Construct(
        "stty",
        "stty -echo 2>/dev/null; echo rc=$?",
        output="rc=1\n",
    ),
    Construct(
        "aliases over what the framework uses",
        "alias printf=false command=false return=false :=false builtin=false",
    ),
    Construct("alias echo=false", "alias echo=false", follow=("\\echo hi", "hi\n", 0)),
    Construct(
        "unset of variables",
        "unset PS1 PS2 PATH HOME IFS __llenvs_rc; unset -f __llenvs_rc",
        then=(("(exit 3)", "", 3), ("echo $?", "3\n", 0)),
    ),
    Construct("unset PS1 PS2 IFS", "unset PS1 PS2 IFS", then=(("echo 'a\nb'", "a\nb\n", 0),)),
    Construct("shopt -s extglob", "shopt -s extglob", busybox=False),
    Construct("IFS=", "IFS=", then=(("sh -c 'exit 12'", "", 12), ("echo $?", "12\n", 0))),
    Construct("IFS=digits", "IFS=0123456789", then=(("sh -c 'exit 12'", "", 12),)),
    Construct("set -u", "set -u", then=(("sh -c 'exit 4'", "", 4),)),
]
_CASES = [
    pytest.param(kind, row, id=f"{kind}: {row.id}")
    for row in CONSTRUCTS
    for kind in ("bash", "busybox")
    if kind == "bash" or row.busybox
]


def assert_clean(result: CommandResult, what: str) -> None:
    """No framework text: no sentinel, no PS2 marker, no trace of our own lines."""
    for leak in ("__llend_", "__llps2_", "__llenvs", ">&-"):
        assert leak not in result.output, (what, result)
    assert not result.timed_out and not result.continuation_prompt, (what, result)
    assert not result.shell_restarted, (what, result)


async def check(shell: ShellSession, command: str, output: str, exit_code: int) -> None:
    result = await shell.run(command, timeout=20)
    assert_clean(result, command)
    assert (result.output, result.exit_code) == (output, exit_code), (command, result)


@pytest.fixture
async def shell_of(
    request: pytest.FixtureRequest, base_image: str, busybox_image: str, make_shell: ShellFactory
) -> ShellSession:
    kind = request.param
    shell: ShellSession = await make_shell(image=base_image if kind == "bash" else busybox_image)
    assert shell.kind == ("bash" if kind == "bash" else "sh")
    return shell


@pytest.mark.parametrize(("shell_of", "row"), _CASES, indirect=["shell_of"])
async def test_construct_keeps_the_shell_clean(shell_of: ShellSession, row: Construct) -> None:
    await check(shell_of, row.command, row.output, row.exit_code)
    await check(shell_of, *row.follow)
    for command, output, exit_code in row.then:
        await check(shell_of, command, output, exit_code)


@pytest.mark.parametrize("shell_of", ["bash", "busybox"], indirect=True)
async def test_set_e_failure_explains_the_restart(shell_of: ShellSession) -> None:
    """A failing command under ``set -e`` ends the shell: its exit code is kept, the
    observation says why, and a fresh shell answers the next command."""
    await check(shell_of, "set -e; cd /tmp", "", 0)
    await check(shell_of, "false && true; echo survived", "survived\n", 0)  # exempt from -e
    failed = await shell_of.run("echo before; ls /no-such-dir", timeout=20)
    assert failed.exit_code == (2 if shell_of.kind == "bash" else 1), failed
    assert failed.shell_restarted and not failed.timed_out, failed
    assert failed.output.startswith("before\n"), failed
    assert "no-such-dir" in failed.output, failed
    assert failed.output.endswith(
        f"[the shell exited with status {failed.exit_code}: `set -e` was on and a command "
        "failed; a new shell was started]\n"
    ), failed
    await check(shell_of, "echo hi; pwd", "hi\n/\n", 0)  # a fresh shell: cwd reset
    one_line = await shell_of.run("set -euo pipefail; false | true", timeout=20)
    assert (one_line.exit_code, one_line.shell_restarted) == (1, True), one_line
    assert "`set -e` was on" in one_line.output, one_line
    await check(shell_of, "echo hi", "hi\n", 0)


@pytest.mark.parametrize("shell_of", ["bash", "busybox"], indirect=True)
async def test_continuation_prompt_survives_ps2_changes(shell_of: ShellSession) -> None:
    """The user's PS2 (or none) never hides an unterminated quote from the framework."""
    await check(shell_of, "PS2='> '", "", 0)
    assert (await shell_of.run('echo "open', timeout=20)).continuation_prompt
    await check(shell_of, "unset PS2", "", 0)
    assert (await shell_of.run("echo 'open", timeout=20)).continuation_prompt
    await check(shell_of, "echo hi", "hi\n", 0)


async def test_syntax_error_after_set_v_is_reported_once(
    base_image: str, make_shell: ShellFactory
) -> None:
    """The shell's own channel carries syntax errors; the echo of our framing does not leak."""
    shell = await make_shell(image=base_image)
    await check(shell, "set -v", "", 0)
    result = await shell.run("echo )", timeout=20)
    assert result.exit_code == 2 and result.output.count("syntax error") == 1, result
    assert "__ll" not in result.output and "&-" not in result.output, result
    await check(shell, "echo hi", "hi\n", 0)


async def test_timeout_still_interrupts_after_traps_and_prompt_command(
    base_image: str, make_shell: ShellFactory
) -> None:
    shell = await make_shell(image=base_image)
    await check(shell, "PROMPT_COMMAND='echo p'; trap 'echo e' ERR; set -x", "", 0)
    interrupted = await shell.run("sleep 1000", timeout=1)
    assert interrupted.timed_out and not interrupted.shell_restarted, interrupted
    assert "__ll" not in interrupted.output, interrupted
    await check(shell, "set +x; trap - ERR", "+ set +x\n", 0)
    await check(shell, "echo hi", "hi\n", 0)


@pytest.mark.parametrize("shell_of", ["bash", "busybox"], indirect=True)
async def test_syntax_errors_are_reported_every_time(shell_of: ShellSession) -> None:
    """The error travels on the shell's channel, the sentinel on the data channel: the
    error must be waited for, not raced (racing lost it in 1 run of 3 here)."""
    for _ in range(30):
        result = await shell_of.run("echo )", timeout=20)
        assert result.exit_code == 2 and result.output.count("syntax error") == 1, result
    await check(shell_of, "echo hi", "hi\n", 0)


@pytest.mark.parametrize("shell_of", ["bash", "busybox"], indirect=True)
async def test_traced_framing_is_never_taken_for_a_prompt(shell_of: ShellSession) -> None:
    """Under ``set -xv`` the shell echoes and traces our lines on its channel, which may
    arrive after the sentinel: none of that may count as a continuation prompt of a slow
    command that follows (it would be interrupted after the prompt wait)."""
    await check(shell_of, "set -xv", "", 0)
    for _ in range(6):
        await check(shell_of, "true", "+ true\n", 0)
        await check(shell_of, "sleep 0.5", "+ sleep 0.5\n", 0)


async def test_dash_syntax_check_survives_xtrace_aliases_and_path(
    base_image: str, make_shell: ShellFactory
) -> None:
    """dash has every command parsed first by ``sh -n``: that probe must not read the
    shell's ``set -x`` lines as errors, nor depend on PATH or aliases."""
    shell = await make_shell(image=base_image, shell="sh")  # Debian's /bin/sh is dash
    await check(shell, "set -x; alias sh=false; unset PATH", "+ alias sh=false\n+ unset PATH\n", 0)
    await check(shell, "echo hi", "+ echo hi\nhi\n", 0)
    invalid = await shell.run("echo )", timeout=20)
    assert invalid.exit_code == 2 and "Syntax error" in invalid.output, invalid
    assert "+ " not in invalid.output, invalid
    assert (await shell.run('echo "open', timeout=20)).continuation_prompt
    await check(shell, "echo hi", "+ echo hi\nhi\n", 0)


@pytest.mark.parametrize("shell_of", ["bash", "busybox"], indirect=True)
async def test_single_line_forms(shell_of: ShellSession) -> None:
    """A one-line command runs as ``{ CMD; }`` (no prompt to read): endings our ``;``
    would break take the multi-line path, unfinished lines are continuations."""
    cases: list[Check] = [
        ("echo hi   ", "hi\n", 0),
        ("echo }; echo '{'", "}\n{\n", 0),
        ("f() { echo in-f; }", "", 0),
        ("f", "in-f\n", 0),
        ("true && echo and", "and\n", 0),
        ("echo semi;", "semi\n", 0),
        ("sleep 0.1 & ", "", 0),
        ("echo a \\\\", "a \\\n", 0),
        ("case x in x) echo matched;; esac", "matched\n", 0),
    ]
    for command, output, exit_code in cases:
        await check(shell_of, command, output, exit_code)
    for unfinished in ("if true; then", "for i in 1 2; do", "echo $(", "true &&", "echo a |"):
        result = await shell_of.run(unfinished, timeout=20)
        assert result.continuation_prompt and not result.shell_restarted, (unfinished, result)
        assert result.output == "", (unfinished, result)
    await check(shell_of, "echo hi", "hi\n", 0)
