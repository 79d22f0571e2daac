"""The seed's synchronous, threaded design, written from its text: the benchmarks' baseline."""

from __future__ import annotations

from .asyncio_floor import floor_lockstep
from .sync_env import LoopThread, SyncCounterEnv, SyncEnvironment, ThreadedEnv, drive
from .sync_runner import SyncLatencyBackend, SyncTrajectoryRunner, sync_replay_restore

__all__ = [
    "LoopThread",
    "SyncCounterEnv",
    "SyncEnvironment",
    "SyncLatencyBackend",
    "SyncTrajectoryRunner",
    "ThreadedEnv",
    "drive",
    "floor_lockstep",
    "sync_replay_restore",
]
