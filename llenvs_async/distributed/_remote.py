"""What crosses the Ray boundary besides payloads: an instance's placement, and exceptions
(an actor's sent back as a value and rebuilt here; Ray's own mapped to ours at this edge)."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import traceback
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from ..env import AgentSurface
from .errors import InstanceLostError, RemoteEnvError

__all__ = [
    "Failure",
    "Placement",
    "Reply",
    "await_ref",
    "failure_of",
    "rebuild",
    "translate",
    "unpicklable",
    "unwrap",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where an instance runs and what it declared: its ``Environment`` attributes and its
    ``AgentSurface`` (sent back by its actor)."""

    node_id: str
    host: str
    pid: int
    actor_id: str
    actor_name: str
    pure_step: bool
    max_steps: int | None
    offer: AgentSurface
    slot: int = 0  # the instance's number in its actor (0 unless instances share one)

    @property
    def info(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": self.host, "pid": self.pid, "actor": self.actor_id}


@dataclass(frozen=True, slots=True)
class Failure:
    """An exception raised in an actor: pickled when it survives a round trip."""

    pickled: bytes | None
    type_name: str
    message: str
    traceback: str


def failure_of(exc: BaseException) -> Failure:
    blob: bytes | None
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)  # classes whose __init__ cannot be re-called fail here
    except Exception:
        blob = None
    kind = type(exc)
    return Failure(
        pickled=blob,
        type_name=f"{kind.__module__}.{kind.__qualname__}",
        message=str(exc),
        traceback="".join(traceback.format_exception(exc)),
    )


Reply = tuple[bool, Any]


def rebuild(failure: Failure, placement: Placement | None) -> BaseException:
    where = "a Ray actor" if placement is None else f"node {placement.node_id} ({placement.host})"
    exc: BaseException | None = None
    if failure.pickled is not None:
        with contextlib.suppress(Exception):
            exc = pickle.loads(failure.pickled)
    if exc is None:
        exc = RemoteEnvError(
            f"{failure.type_name}: {failure.message} (on {where})",
            node_id=None if placement is None else placement.node_id,
            actor_id=None if placement is None else placement.actor_id,
            remote_type=failure.type_name,
        )
    exc.add_note(f"raised on {where}:\n{failure.traceback}")
    return exc


def unwrap(reply: Reply, placement: Placement | None) -> Any:
    ok, value = reply
    if ok:
        return value
    raise rebuild(value, placement)


def translate(exc: RayError, placement: Placement | None, doing: str) -> RemoteEnvError:
    """Ray's error as ours: a dead actor or node is ``InstanceLostError``."""
    node = None if placement is None else placement.node_id
    actor = None if placement is None else placement.actor_id
    where = "" if placement is None else f" on node {node} ({placement.host})"
    kind = InstanceLostError if isinstance(exc, RayActorError) else RemoteEnvError
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return kind(
        f"{doing}: the Ray actor{where} failed ({type(exc).__name__}: {first})",
        node_id=node,
        actor_id=actor,
        remote_type=type(exc).__name__,
    )


def unpicklable(
    exc: Exception, placement: Placement | None, doing: str, what: str = "reply"
) -> RemoteEnvError:
    """A call or reply one side could not unpickle, as Ray's own failure to would be."""
    where = "" if placement is None else f" on node {placement.node_id} ({placement.host})"
    side = "in the actor" if what == "call" else f"of the Ray actor{where} here"
    return RemoteEnvError(
        f"{doing}: the {what} could not be unpickled {side} ({type(exc).__name__}: {exc})",
        node_id=None if placement is None else placement.node_id,
        actor_id=None if placement is None else placement.actor_id,
        remote_type=type(exc).__name__,
    )


async def await_ref(
    ref: Any, placement: Placement | None, doing: str, *, cancel_remote: bool = True
) -> Any:
    """Await one actor call; cancelling the caller cancels the remote coroutine too, as a
    local one would be (``cancel_remote=False``: it runs on, for creation and close)."""
    try:
        return await ref
    except asyncio.CancelledError:
        if cancel_remote:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        raise
    except RayError as exc:
        raise translate(exc, placement, doing) from exc
