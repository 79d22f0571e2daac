"""A driver that makes two Harbor instances through Ray, prints their actor pids and dies
by SIGKILL (no cleanup of its own runs): ``python -m tests.distributed._crashing_driver ADDR``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from llenvs_async.distributed import connect, ray_env_factory
from tests.distributed import _envs


async def main() -> None:
    factory = ray_env_factory(_envs.harbor)
    proxies = [await factory() for _ in range(2)]
    for proxy in proxies:
        await proxy.reset("csv-totals")  # a container now runs for each
    print(" ".join(str(p.placement.pid) for p in proxies), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    with connect(sys.argv[1]):
        asyncio.run(main())
