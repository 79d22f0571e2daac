"""The persistent shell: state, exit codes, output capping, PS2, timeouts, recovery."""

from __future__ import annotations

import asyncio

import pytest

from llenvs_async.docker import ShellSession
from llenvs_async.errors import ClosedError

from .conftest import ShellFactory


async def _procs(shell: ShellSession) -> list[str]:
    """Command lines of the processes in the shell's container (busybox and procps ``ps``)."""
    result = await shell.container.exec("ps -eo args 2>/dev/null || ps -o args")
    assert result.exit_code == 0, result.output
    return [line.strip() for line in result.output.splitlines()[1:]]


@pytest.fixture(params=["bash", "busybox"])
async def any_shell(
    request: pytest.FixtureRequest, base_image: str, busybox_image: str, make_shell: ShellFactory
) -> ShellSession:
    """A shell of each kind: bash in the Debian image, ash in busybox."""
    image = base_image if request.param == "bash" else busybox_image
    shell = await make_shell(image=image)
    assert shell.kind == ("bash" if request.param == "bash" else "sh")
    return shell


async def test_cwd_and_exported_variables_persist(any_shell: ShellSession) -> None:
    first = await any_shell.run("cd /tmp; export X=1")
    assert first.exit_code == 0
    second = await any_shell.run('pwd; echo "X=$X"')
    assert second.output == "/tmp\nX=1\n"


async def test_exit_codes_and_stderr_are_reported(any_shell: ShellSession) -> None:
    failed = await any_shell.run("echo to-stdout; echo to-stderr >&2; sh -c 'exit 7'")
    assert failed.exit_code == 7
    assert failed.output == "to-stdout\nto-stderr\n"
    assert not failed.ok
    assert (await any_shell.run("echo $?")).output == "7\n"
    missing = await any_shell.run("cat /no/such/file")
    assert missing.exit_code not in (0, None)
    assert "/no/such/file" in missing.output
    no_newline = await any_shell.run("printf abc")
    assert (no_newline.output, no_newline.exit_code) == ("abc", 0)


async def test_comment_only_command_is_a_no_op(any_shell: ShellSession) -> None:
    result = await any_shell.run("# nothing to do\n\n")
    assert (result.output, result.exit_code) == ("", 0)
    assert (await any_shell.run("echo still-here")).output == "still-here\n"


async def test_ten_megabytes_of_output_are_capped_head_and_tail(any_shell: ShellSession) -> None:
    command = "echo START; head -c 10000000 /dev/zero | tr '\\0' x; echo; echo END"
    async with asyncio.timeout(60):
        result = await any_shell.run(command, timeout=50)
    assert result.exit_code == 0 and not result.timed_out
    assert result.output.startswith("START\nxxx")
    assert result.output.endswith("xxx\nEND\n")
    assert "bytes of output truncated" in result.output
    limit = any_shell.max_output_bytes
    assert result.truncated_bytes == 10_000_000 + len("START\n\nEND\n") - limit
    assert len(result.output) < limit + 200
    assert (await any_shell.run("echo after")).output == "after\n"


async def test_a_pipe_cut_by_head_adds_no_shell_chatter(
    base_image: str, make_shell: ShellFactory
) -> None:
    # ``yes`` dies of SIGPIPE in the foreground; bash -i then complains about the terminal
    # it does not have, right after output with no final newline.
    shell = await make_shell(image=base_image)
    for command, tail in (("yes | head -c 5", "y\ny\ny"), ("yes | head -c 200001", "y\ny\ny")):
        result = await shell.run(command, timeout=30)
        assert result.exit_code == 0
        assert "tcsetattr" not in result.output and "bash:" not in result.output
        assert result.output.endswith(tail)


async def test_binary_output_is_decoded_with_replacement(any_shell: ShellSession) -> None:
    invalid = await any_shell.run("printf '\\377\\376abc\\000def'")
    assert invalid.exit_code == 0
    assert invalid.output == "\ufffd\ufffdabc\x00def"
    noise = await any_shell.run("head -c 200000 /dev/urandom")
    assert noise.exit_code == 0 and isinstance(noise.output, str)
    assert (await any_shell.run("echo ok")).output == "ok\n"


async def test_unterminated_quote_is_a_continuation_prompt(any_shell: ShellSession) -> None:
    await any_shell.run("cd /tmp")
    # Ctrl-C resynchronises the shell; the 2 s default grace missed it once on a loaded CI
    # run (restart after 5.5 s): a wider bound keeps the claim, not the machine's speed
    any_shell.grace_s = 30.0
    stuck = await any_shell.run('echo "unterminated')
    assert stuck.continuation_prompt
    assert not stuck.shell_restarted and not stuck.ok
    after = await any_shell.run("echo usable; pwd")
    assert after.output == "usable\n/tmp\n"  # same shell: cwd kept
    assert not after.continuation_prompt


async def test_output_repeating_the_ps2_marker_is_not_a_continuation_prompt(
    any_shell: ShellSession,
) -> None:
    """A command may print the shell's PS2 (``echo "$PS2"``, ``set``): that is output,
    not a prompt; the command is neither reported as discarded nor interrupted."""
    for command in ('echo "$PS2"; echo after', 'echo "$PS2$PS2$PS2"\necho after'):
        result = await any_shell.run(command, timeout=10)
        assert not result.continuation_prompt, (command, result)
        assert result.exit_code == 0 and not result.shell_restarted, (command, result)
        assert result.output.endswith("__\nafter\n"), (command, result)
        assert result.output.startswith("__llps2_"), (command, result)
    stuck = await any_shell.run('echo "open\necho more')
    assert stuck.continuation_prompt and "__llps2_" not in stuck.output, stuck
    assert (await any_shell.run("echo ok")).output == "ok\n"


@pytest.mark.parametrize(
    "command",
    ["cat <<EOF\nno terminator", "if true; then\necho never closed", "echo 'one\ntwo", "echo a \\"],
)
async def test_incomplete_constructs_are_continuation_prompts(
    base_image: str, make_shell: ShellFactory, command: str
) -> None:
    shell = await make_shell(image=base_image)
    assert (await shell.run(command)).continuation_prompt
    assert (await shell.run("echo ok")).output == "ok\n"


async def test_multiline_commands_are_not_continuations(any_shell: ShellSession) -> None:
    loop = await any_shell.run("for i in 1 2; do\n  echo $i\ndone")
    assert (loop.output, loop.continuation_prompt) == ("1\n2\n", False)
    heredoc = await any_shell.run("cat <<'EOF'\n$HOME stays literal\nEOF")
    assert heredoc.output == "$HOME stays literal\n"
    function = await any_shell.run("greet() {\n  echo hi $1\n}\ngreet you")
    assert function.output == "hi you\n"
    assert (await any_shell.run("greet again")).output == "hi again\n"


async def test_syntax_error_is_reported_once(any_shell: ShellSession) -> None:
    result = await any_shell.run("echo )")
    assert result.exit_code == 2 and not result.continuation_prompt
    assert result.output.count("syntax error") == 1
    assert (await any_shell.run("echo fine")).output == "fine\n"


async def test_timeout_interrupts_and_leaves_no_process(any_shell: ShellSession) -> None:
    async with asyncio.timeout(20):
        result = await any_shell.run("sleep 1000", timeout=1)
    assert result.timed_out and not result.shell_restarted
    assert not any(args.startswith("sleep 1000") for args in await _procs(any_shell))
    assert (await any_shell.run("echo alive")).output == "alive\n"


async def test_timeout_kills_a_child_that_ignores_sigint(
    base_image: str, make_shell: ShellFactory
) -> None:
    shell = await make_shell(image=base_image)
    await shell.run("export KEEP=me")
    async with asyncio.timeout(30):
        result = await shell.run("sh -c \"trap '' INT; sleep 1001; echo survived\"", timeout=1)
    assert result.timed_out and "survived" not in result.output
    assert not any("sleep 1001" in args for args in await _procs(shell))
    assert (await shell.run("echo $KEEP")).output == "me\n"  # recovered without a restart


async def test_shell_that_ignores_sigint_is_replaced(
    busybox_image: str, make_shell: ShellFactory
) -> None:
    shell = await make_shell()
    async with asyncio.timeout(30):
        result = await shell.run("trap '' INT; while :; do :; done", timeout=1)
    assert result.timed_out and result.shell_restarted
    assert (await shell.run("echo fresh")).output == "fresh\n"


async def test_background_child_holding_stdout_does_not_stall(any_shell: ShellSession) -> None:
    async with asyncio.timeout(10):
        started = await any_shell.run("(sleep 30; echo late) & echo started")
        assert started.output.splitlines()[-1] == "started"
        assert (await any_shell.run("echo next")).output.endswith("next\n")
    assert any(args.startswith("sleep 30") for args in await _procs(any_shell))


async def test_exit_replaces_the_shell(any_shell: ShellSession) -> None:
    await any_shell.run("export GONE=1")
    result = await any_shell.run("exit 3")
    assert (result.exit_code, result.shell_restarted) == (3, True)
    assert (await any_shell.run('echo "[$GONE]"')).output == "[]\n"


async def test_cancelled_run_is_settled_before_the_next(any_shell: ShellSession) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await any_shell.run("sleep 1002; echo finished")
    async with asyncio.timeout(20):
        after = await any_shell.run("echo next")
    assert after.output == "next\n"
    assert not any(args.startswith("sleep 1002") for args in await _procs(any_shell))


async def test_concurrent_runs_are_serialized(any_shell: ShellSession) -> None:
    commands = [f"echo {i}; sleep 0.0{i}; echo {i}" for i in range(5)]
    results = await asyncio.gather(*(any_shell.run(c) for c in commands))
    assert [r.output for r in results] == [f"{i}\n{i}\n" for i in range(5)]


async def test_closed_session_refuses_commands(any_shell: ShellSession) -> None:
    pid = any_shell.pid
    await any_shell.aclose()
    await any_shell.aclose()
    with pytest.raises(ClosedError):
        await any_shell.run("true")
    assert not any(
        args.startswith(("bash --noprofile", "sh -i")) for args in await _procs(any_shell)
    )
    assert pid > 0


async def test_restart_gives_a_fresh_shell(any_shell: ShellSession) -> None:
    await any_shell.run("cd /tmp; export STATE=old")
    old_pid = any_shell.pid
    await any_shell.restart()
    assert any_shell.pid not in (0, old_pid)
    assert (await any_shell.run('pwd; echo "[$STATE]"')).output == "/\n[]\n"
    gone = await any_shell.run(f"kill -0 {old_pid} 2>/dev/null || echo gone")
    assert gone.output == "gone\n"  # the old shell was killed, not leaked


async def test_dash_syntax_errors_do_not_swallow_the_sentinel(
    base_image: str, make_shell: ShellFactory
) -> None:
    shell = await make_shell(image=base_image, shell="sh")  # Debian's /bin/sh is dash
    assert shell.kind == "sh"
    await shell.run("cd /tmp")
    async with asyncio.timeout(20):  # no command timeout: a lost sentinel would hang here
        invalid = await shell.run("echo )")
        incomplete = await shell.run("if true; then\necho never closed")
        quote = await shell.run('echo "open')
        after = await shell.run("pwd")
    assert invalid.exit_code == 2 and "Syntax error" in invalid.output
    assert not invalid.continuation_prompt
    assert incomplete.continuation_prompt and quote.continuation_prompt
    assert after.output == "/tmp\n"
