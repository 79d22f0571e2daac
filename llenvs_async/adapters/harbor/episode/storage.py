"""The task's ``storage_mb``, held on hosts without disk quotas (overlay2 on ext4).

Two parts: each file is capped at the limit by the kernel (``RLIMIT_FSIZE``, set on the
container: a single ``dd`` stops at once, ``File size limit exceeded``), and the total is
watched: the box's writable layer is measured every ``every`` seconds while a command runs
(past the limit the command is stopped like a timed-out one) and after a command at most
that often (a background writer between steps). A breach ends the episode with a verified 0
(``reward_source`` ``"storage-limit"``): the limit is the task's, as a memory limit is.
Each measurement is one engine call (the daemon sums the layer: ~10-30 ms for a few
thousand files); a command shorter than ``every`` costs none.
"""

from __future__ import annotations

import asyncio
import time

from ....docker.runtime import RuntimeHost
from ....errors import LlenvsError

__all__ = ["StorageWatch"]

_MIB = 1 << 20


class StorageWatch:
    """Holds ``box``'s writable layer to ``limit_mb`` MiB (see the module doc); ``breach``
    says why the episode must end once it is over; ``full``: the last measurement found the
    layer at the limit (a write past it fails: ``note`` says so to the model)."""

    def __init__(self, box: RuntimeHost, limit_mb: int, *, every: float = 0.5) -> None:
        self.box, self.limit_mb, self.every = box, limit_mb, every
        self.breach: str | None = None
        self.full = False
        self._measured = time.monotonic()  # the box starts within its limit

    async def during(self) -> str:
        """A command's stop watch: returns the breach once the layer is over the limit."""
        while True:
            await asyncio.sleep(self.every)
            if (breach := await self._measure()) is not None:
                return breach

    async def after(self) -> str | None:
        """Measure after a command when the last measurement is ``every`` seconds old; the
        breach, if any (an engine error measures nothing)."""
        if self.breach is None and time.monotonic() - self._measured >= self.every:
            try:
                await self._measure()
            except LlenvsError:
                return None
        return self.breach

    @property
    def note(self) -> str:
        return (
            f"[the container's files are at the task's storage_mb = {self.limit_mb}: "
            "writes past it fail]"
        )

    async def _measure(self) -> str | None:
        used = await self.box.storage_used()
        self._measured = time.monotonic()
        self.full = used >= self.limit_mb * _MIB
        if used > self.limit_mb * _MIB:
            self.breach = (
                f"the container's files reached {used / _MIB:.0f} MiB, over the task's "
                f"storage_mb = {self.limit_mb}"
            )
        return self.breach
