"""distributed._wire without Ray: a state the actor holds travels as its key or a short
patch, a next state as a history delta the driver applies to its own state."""

from __future__ import annotations

import dataclasses
import sys
from types import MappingProxyType
from typing import Any

import pytest

pytest.importorskip("ray")

from llenvs_async.distributed import _wire
from llenvs_async.envs import CounterEnv
from llenvs_async.types import Action, ActionPath, Completion, State, TokenStep


def shipped(obj: Any) -> Any:
    """``obj`` after a trip: pickled by ``dumps`` (which must manage) and loaded."""
    blob = _wire.dumps(obj)
    assert type(blob) is bytes
    return _wire.loads(blob)


async def test_a_long_episode_ships_constant_size_payloads_and_shares_history() -> None:
    env = CounterEnv(max_steps=None)  # the "actor's" instance
    actor_side = _wire.StateCache()
    state = await env.reset(100)
    actor_side.remember(0, shipped(state))
    held: tuple[int, State] | None = (0, state)
    sizes = []
    for key in range(1, 41):
        completion = Completion(text="inc", token_ids=(1, 2), prompt_token_ids=tuple(range(200)))
        action = Action(text="inc", completion=completion)
        payload = _wire.dumps((key, _wire.encode_state(state, held), action))
        got_key, wire, got_action = _wire.loads(payload)
        remote_state = actor_side.decode(wire)
        assert remote_state == state and remote_state.history == state.history
        result = await env.step(remote_state, got_action)
        reply = _wire.dumps(_wire.encode_result(result, remote_state, got_action))
        actor_side.remember(got_key, result.next_state)
        status, value = _wire.loads(reply)
        local = _wire.decode_result(status, value, state, action)
        assert status == _wire.DELTA and type(local) is type(result)
        assert local == result and local.next_state.history == result.next_state.history
        # As after a local step: the next state extends this very history, with this action.
        assert local.next_state.history.extends(state.history)
        assert local.next_state.history.last is not None
        assert local.next_state.history.last.action is action
        sizes.append((len(payload), len(reply)))
        held = (key, local.next_state)
        state = local.next_state
        if key % 3 == 0:  # token mode re-tags the last step: sent as a patch, not in full
            tokens = TokenStep(action_ids=(key,), observation_ids=(key, key))
            path = state.actions
            assert isinstance(path, ActionPath)
            state = dataclasses.replace(state, actions=path.with_tokens(tokens))
            wire = _wire.encode_state(state, held)
            assert wire[:3] == (_wire.PATCHED, key, ())  # no field but the history changed
            there = actor_side.decode(wire)
            assert there is not None and there.history == state.history
            assert there.history.last is not None and there.history.last.tokens == tokens
    assert max(s for s, _ in sizes[-5:]) < 2 * max(s for s, _ in sizes[:5])
    assert max(r for _, r in sizes) < 600
    full = _wire.dumps((41, state, action))
    assert len(full) > 10 * sizes[-1][0]  # what every step used to carry


async def test_states_the_actor_does_not_hold_go_in_full_or_miss() -> None:
    env = CounterEnv(max_steps=None)
    first = await env.reset(3)
    other = await CounterEnv(max_steps=None).reset(5)
    assert _wire.encode_state(first, None) is first
    assert _wire.encode_state(other, (0, first)) is other  # unrelated history: in full
    assert _wire.encode_state(first, (7, first)) == (_wire.KNOWN, 7)
    cache = _wire.StateCache()
    assert cache.decode((_wire.KNOWN, 7)) is None  # a miss: the driver resends in full
    for key in range(_wire.CACHE_SIZE + 2):
        cache.remember(key, first)
    assert cache.decode((_wire.KNOWN, 0)) is None and cache.decode((_wire.KNOWN, 5)) is first
    cache.remember(9, "not a state")
    assert cache.decode((_wire.KNOWN, 9)) is None
    # A result whose next state does not continue the stepped one travels whole.
    step = await env.step(first, Action(text="inc"))
    assert _wire.encode_result(step, other, Action(text="inc")) == (_wire.OK, step)
    assert _wire.decode_result(_wire.OK, step, other, Action(text="inc")) is step


class Scripted:
    """Stands for a class defined in the driver's script (cloudpickle ships it by value)."""


def test_dumps_leaves_to_ray_what_pickle_cannot_ship_faithfully(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = MappingProxyType({"a": 1})
    assert shipped(proxy) == proxy and type(shipped(proxy)) is MappingProxyType
    monkeypatch.setattr(Scripted, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "Scripted", Scripted, raising=False)
    unpicklable = type("Unnamed", (), {})  # no module attribute holds it
    for unsafe in (lambda: 1, Scripted, [1, Scripted()], unpicklable):
        assert _wire.dumps(unsafe) is unsafe
    assert _wire.loads(b"\x80\x05K\x01.") == 1 and _wire.loads((1,)) == (1,)
