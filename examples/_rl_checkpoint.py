"""Checkpoints of ``train_agent_rl.py``'s loop (``--resume DIR``): what a restarted loop needs
to go on from its last finished step.

One file per (estimator, seed), replaced atomically after the warm-up and after every RL
step: the policy's weights, its Adam state, the frozen reference of the KL term, the loop's
step and the policy version the engine served, the task sampler's state and the log so far.
A killed loop restarted with the same flags loads it, pushes the weights to the fresh
engine under the saved version and continues with the next step: nothing finished is
redone. The stream's rollouts in flight at the kill are not kept; the restarted stream
samples new ones from the restored policy (the staleness bound holds: nothing older than
the restored version is trained on), and the task sampler goes on from its saved state
(tasks the lost rollouts had drawn are not redrawn: the tasks stay uniform draws).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class LoopState:
    """Where the loop stands: RL steps done, the policy version, the sampler, the log."""

    step: int
    version: int
    task_rng: Any  # random.Random.getstate()
    result: dict[str, Any]


def checkpoint_path(root: Path, estimator: str, seed: int) -> Path:
    return root / f"{estimator}-seed{seed}.pt"


def save(path: Path, policy: Any, loop: LoopState) -> None:
    """Write the checkpoint next to ``path`` and move it in place (a kill leaves the old)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": policy.model.state_dict(),
        "optimizer": policy.optimizer.state_dict(),
        "reference": None if policy.reference is None else policy.reference.state_dict(),
        "rl_steps": policy.rl_steps,
        "loop": {
            "step": loop.step,
            "version": loop.version,
            "task_rng": loop.task_rng,
            "result": loop.result,
        },
    }
    partial = path.with_name(f".{path.name}.partial")
    torch.save(state, partial)
    os.replace(partial, path)


def load(path: Path, policy: Any) -> LoopState | None:
    """Restore ``policy`` (weights, optimizer, reference) from ``path``; the loop's state,
    or ``None`` when there is no checkpoint yet."""
    import torch

    if not path.is_file():
        return None
    state = torch.load(path, weights_only=True)
    policy.model.load_state_dict(state["model"])
    policy.optimizer.load_state_dict(state["optimizer"])
    if state["reference"] is not None:
        policy.reference = copy.deepcopy(policy.model).requires_grad_(False)
        policy.reference.load_state_dict(state["reference"])
    policy.rl_steps = state["rl_steps"]
    loop = state["loop"]
    return LoopState(
        step=loop["step"], version=loop["version"], task_rng=_tuples(loop["task_rng"]),
        result=loop["result"],
    )  # fmt: skip


def _tuples(value: Any) -> Any:
    """``random.Random.setstate`` wants tuples where a round trip may give lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list | tuple) else value
