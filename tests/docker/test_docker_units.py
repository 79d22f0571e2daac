"""Engine-free units of the docker layer: capping, stream scanning, parsing, specs, shielding."""

from __future__ import annotations

import subprocess

import pytest

from llenvs_async._ownership import OWNER_LABEL, Owner, current_owner, process_alive
from llenvs_async.docker import CommandResult, ContainerSpec, format_observation
from llenvs_async.docker.engine import split_image_ref
from llenvs_async.host import KILL_TREE_SCRIPT, UPTIME_TICKS, CappedOutput
from llenvs_async.host._shell_framing import DATA, TAGGED, Scanner
from llenvs_async.shell_task import cap_text


def test_capped_output_keeps_head_and_tail() -> None:
    out = CappedOutput(10)
    for chunk in (b"abc", b"defghij", b"klmnopqrst", b"uvwxyz"):
        out.feed(chunk)
    assert out.total == 26 and out.truncated_bytes == 16
    assert out.text() == "abcde\n[... 16 bytes of output truncated ...]\nvwxyz"
    small = CappedOutput(10)
    small.feed(b"0123456789")
    assert (small.text(), small.truncated_bytes) == ("0123456789", 0)


def test_capped_output_decodes_invalid_utf8_with_replacement() -> None:
    out = CappedOutput(100)
    out.feed("é".encode()[:1] + b"ok\xff")
    assert out.text() == "\ufffdok\ufffd"


def test_scanner_finds_tagged_items_split_across_chunks() -> None:
    sentinels = Scanner(b"<END>", b"\n")
    stream = b"hello<END>7:0\nwor<END>8:1:hB\nld<EN"
    events: list[tuple[int, bytes]] = []
    for i in range(len(stream)):  # one byte at a time: the worst split
        events += sentinels.feed(stream[i : i + 1])
    assert b"".join(p for kind, p in events if kind == DATA) == b"helloworld"
    assert [p for kind, p in events if kind == TAGGED] == [b"7:0", b"8:1:hB"]
    assert sentinels.feed(b"x") == [(DATA, b"<ENx")]  # a possible tag start was held back
    prompts = Scanner(b"<PS2>", b"__")
    assert prompts.feed(b"a<PS2>3__<PS2>3") == [(DATA, b"a"), (TAGGED, b"3")]
    assert prompts.feed(b"__b") == [(TAGGED, b"3"), (DATA, b"b")]


def test_scanner_passes_on_a_tag_that_never_ends() -> None:
    scanner = Scanner(b"<T>", b"\n")
    assert scanner.feed(b"a<T>b") == [(DATA, b"a")]
    events = scanner.feed(b"x" * 10_000)
    assert b"".join(p for _, p in events) == b"<T>b" + b"x" * 10_000
    assert all(kind == DATA for kind, _ in events)


def test_cap_text_keeps_head_and_tail_and_counts_the_middle() -> None:
    text = "".join(f"{i:04d}" for i in range(100))  # 400 characters
    capped = cap_text(text, 100)
    head, note, tail = capped.split("\n")
    assert head == text[:50] and tail == text[-50:]
    assert note == "[... 300 characters omitted ...]"
    assert cap_text(text, 400) == text and cap_text(text, None) == text


def test_format_observation() -> None:
    assert format_observation(CommandResult(output="hi\n", exit_code=0)) == "hi"
    assert format_observation(CommandResult(output="", exit_code=2)) == "[exit code: 2]"
    slow = CommandResult(output="x", exit_code=130, timed_out=True, shell_restarted=True)
    text = format_observation(slow, 5)
    assert text.startswith("x\n[command timed out after 5s") and "shell was restarted" in text


def test_container_spec_safe_config_and_validation() -> None:
    config = ContainerSpec(image="img", env={"A": "1"}, labels={"x": "y"}).to_config({"o": "me"})
    host = config["HostConfig"]
    assert config["Entrypoint"] == ["sleep", "infinity"] and config["Env"] == ["A=1"]
    assert config["Labels"] == {"x": "y", "o": "me"}
    assert (host["NetworkMode"], host["Privileged"], host["Init"]) == ("none", False, True)
    assert host["SecurityOpt"] == ["no-new-privileges:true"] and host["Binds"] == []
    assert ContainerSpec(image="i", network_mode="bridge").to_config({})["NetworkDisabled"] is False
    with pytest.raises(ValueError, match="pids_limit"):
        ContainerSpec(image="i", pids_limit=0)
    with pytest.raises(ValueError, match="ours"):
        ContainerSpec(image="i", labels={OWNER_LABEL: "spoof"})
    with pytest.raises(ValueError, match="image"):
        ContainerSpec(image="")


def test_owner_labels_round_trip_and_liveness() -> None:
    me = current_owner()
    parsed = Owner.from_labels({**me.labels, "llenvs.owner.start": me.start})
    assert parsed == me and process_alive(me)
    assert Owner.from_labels({OWNER_LABEL: "nohost"}) is None
    assert not process_alive(Owner(host=me.host, pid=me.pid, start="1"))  # a reused pid


def test_split_image_ref() -> None:
    assert split_image_ref("llenvs/base:bookworm") == ("llenvs/base", "bookworm")
    assert split_image_ref("busybox") == ("busybox", "latest")
    assert split_image_ref("localhost:5000/img") == ("localhost:5000/img", "latest")


@pytest.mark.parametrize(
    ("uptime", "ticks"),
    [("0.08", 8), ("0.68", 68), ("0.00", 0), ("1.27", 127), ("4061.05", 406105)],
)
def test_the_kill_script_reads_a_young_sandboxs_uptime_in_decimal(uptime: str, ticks: int) -> None:
    """gVisor's uptime starts at 0: "0.08" must be 8 ticks (not the invalid octal 008)."""
    script = f"up={uptime}; {UPTIME_TICKS}; echo $((up - 0))"
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(ticks)
    assert UPTIME_TICKS in KILL_TREE_SCRIPT
