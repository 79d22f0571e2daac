"""What a failed ``runsc`` call reports: the end of its output, and a Go crash's cause."""

from __future__ import annotations

from llenvs_async.sandbox.runsc import failure_text


def test_a_panic_keeps_its_cause_line_ahead_of_the_stack_tail() -> None:
    stacks = "".join(f"goroutine {i} [running]:\n\tpkg/f.go:{i} +0x1\n" for i in range(200))
    text = failure_text(b"panic: restore: connection reset\n\n" + stacks.encode())
    assert text.startswith("panic: restore: connection reset [...] ")
    assert text.endswith("pkg/f.go:199 +0x1") and len(text) < 600


def test_a_short_or_ordinary_failure_is_its_own_end() -> None:
    assert failure_text(b"  fatal error: out of memory\n") == "fatal error: out of memory"
    long = b"x" * 1000 + b"\ncontainer not found"
    assert failure_text(long) == long.decode()[-500:]
