"""Why a verifier that needed the internet failed: its low reward says nothing about the agent."""

from __future__ import annotations

import re

from ....errors import VerifierError
from ..images.provision import offline_test_sh
from ..tasks.task import HarborTask
from .verification import verifier_environment

__all__ = ["check_offline_verifier"]

# What a download failing for want of a network prints (curl, wget, pip, uv, apt, git, python).
_NO_NETWORK_RE = re.compile(
    r"Could not resolve host|Temporary failure (?:in name resolution|resolving)|"
    r"Name or service not known|Network is unreachable|Failed to establish a new connection|"
    r"unable to resolve host|failed to lookup address|No address associated with hostname|"
    r"dns error",
    re.IGNORECASE,
)


def check_offline_verifier(
    task: HarborTask, log: str, *, network: bool, bridge: bool, provisioned: bool
) -> None:
    """Raise ``VerifierError(kind="network")`` when the verifier's ``log`` shows it failed to
    reach the internet, saying why its container had none (``network``: it was given one;
    ``bridge``: the daemon has a bridge, so ``--allow-network`` can help; ``provisioned``:
    the image was provisioned)."""
    match = _NO_NETWORK_RE.search(log)
    if match is None:
        return
    start = log.rfind("\n", 0, match.start()) + 1
    end = log.find("\n", match.end())
    line = log[start : end if end >= 0 else len(log)].strip()
    if network and not bridge:
        why = (
            "its container was given a network, yet the Docker daemon has no bridge "
            "network (dockerd --bridge=none, as on this machine), so containers get only "
            "loopback (run the daemon with a bridge to give them the internet)"
        )
    elif network:
        why = "its container was given a network but could not resolve or reach the host"
    elif not verifier_environment(task).wants_network:
        table = "[verifier.environment]" if task.config.verifier.separate else "task"
        why = f"its container has none: the {table}'s network_mode is 'no-network'"
    elif bridge:
        why = (
            "its container has none: the run grants none "
            "(pass --allow-network, HarborAdapter(allow_network=True))"
        )
    else:
        why = (
            "its container has none: the run grants none, and --allow-network would not "
            "help: the Docker daemon has no bridge network (dockerd --bridge=none), so "
            "containers get only loopback"
        )
    hint = ""
    if not provisioned and offline_test_sh(
        (task.tests_dir / "test.sh").read_text(encoding="utf-8")
    ):
        hint = (
            "; its test.sh has a shape (uv/uvx, or pip install of packages) that "
            "--build-network --provision-verifier fetches at build time "
            "(HarborAdapter(provision_verifier=True))"
        )
    raise VerifierError(
        f"the verifier of {task.name!r} needs the internet but {why}; "
        f"it printed: {line[:300]!r}{hint}",
        kind="network",
        path="/tests/test.sh",
    )
