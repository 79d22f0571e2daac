"""Keep a single-machine Ray cluster on 127.0.0.1.

Ray rewrites a loopback node or cluster address to the machine's routable IP (so that
other machines could join). A cluster whose every node is on this machine must not
send traffic anywhere else, so this leaves loopback addresses as they are. It patches
``ray._private.services.resolve_ip_for_localhost`` in this process only; a real
multi-node cluster (routable addresses) is unaffected.
"""

from __future__ import annotations

import ipaddress
import sys

__all__ = ["is_loopback", "keep_loopback", "main"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an IP) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def keep_loopback() -> None:
    """Make Ray keep loopback addresses in this process (idempotent)."""
    from ray._private import services

    original = services.resolve_ip_for_localhost
    if getattr(original, "_llenvs_loopback", False):
        return

    def resolve(host: str) -> str:
        return host if is_loopback(host) else original(host)

    resolve._llenvs_loopback = True  # type: ignore[attr-defined]
    services.resolve_ip_for_localhost = resolve


def main() -> None:
    """``python -m llenvs_async.distributed._loopback start ...``: ``ray`` CLI, loopback kept."""
    keep_loopback()
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *sys.argv[1:]]
    ray_main()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
