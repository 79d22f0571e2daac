"""The one owner rule every reaper uses: a zombie or a reused pid is gone, an owner that
cannot be checked from here is reaped only with ``force``, and the marker round-trips."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

from llenvs_async._ownership import Owner, current_owner, owner_gone, process_alive


def test_a_zombie_owner_is_gone_until_waited_for_and_after() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = dataclasses.replace(current_owner(), pid=child.pid, start="")
    try:
        # exited, not yet reaped (WNOWAIT): a zombie, though os.kill(pid, 0) still succeeds
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert not process_alive(owner) and owner_gone(owner)
    finally:
        child.wait(timeout=10)
    assert not process_alive(owner)  # reaped: no such pid


def test_live_reused_and_unreachable_owners() -> None:
    me = current_owner()
    assert process_alive(me) and not owner_gone(me)
    reused = dataclasses.replace(me, start=str(int(me.start) - 1))
    assert owner_gone(reused)
    elsewhere = dataclasses.replace(me, pid=1, pidns="1")  # another PID namespace
    assert process_alive(elsewhere) and not owner_gone(elsewhere)
    assert owner_gone(elsewhere, force=True)


def test_the_marker_round_trips_and_rejects_garbage() -> None:
    me = current_owner()
    assert Owner.from_marker(me.marker) == me
    assert Owner.from_marker("") is None
    assert Owner.from_marker("llenvs.owner=nohost") is None
