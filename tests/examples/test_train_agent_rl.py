"""``examples/train_agent_rl.py``: its Monte Carlo advantages, and a short real run.

The advantage tests would fail with V = 0, a flipped sign or an off-by-one step: they check
``A_t = r_t + V(s_{t+1}) - V(s_t)`` on hand-set values, and on values ``estimate_values``
measured for a pure corridor game where an early wasted move is irrecoverable. The run tests
drive the real loop (vLLM CPU engine, Harbor tasks in Docker): both estimators for its
accounting, and 15 GRPO steps for improvement, measured on the policy's exact held-out
success (no sampling noise) from a warm-up whose start is known.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from llenvs_async import Action, Observation, SamplingParams, State, Trajectory, TrajectoryRunner
from llenvs_async.backends.scripted import ScriptedBackend
from llenvs_async.envs import ChainEnv
from llenvs_async.types import Completion, GenerationRequest, Transition
from tests.engine.conftest import vllm_ready  # noqa: F401  (a fixture: skip, or fail in CI)

from .conftest import load_example, run_example


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("train_agent_rl.py")


def _trajectory(task: int, rewards: list[float]) -> tuple[Trajectory, list[State]]:
    """An episode of ``len(rewards)`` generated steps whose states are all distinct."""
    states = [State(observation=Observation(text="s0"), task=task)]
    transitions = []
    for i, reward in enumerate(rewards):
        done = i == len(rewards) - 1
        action = Action(text=f"a{i}")
        nxt = states[-1].advance(action, Observation(text=f"s{i + 1}"), terminated=done)
        transitions.append(
            Transition(state=states[-1], action=action, next_state=nxt, reward=reward,
                       completion=Completion(text=f"a{i}"))
        )  # fmt: skip
        states.append(nxt)
    traj = Trajectory(episode_id="e", initial_state=states[0], transitions=tuple(transitions))
    return traj, states


def test_vine_samples_are_td_errors_of_the_given_values(example: ModuleType) -> None:
    traj, states = _trajectory(task=0, rewards=[0.0, 0.0, 1.0])
    values = {0.2: states[0], 0.5: states[1], 0.9: states[2]}
    value = {example.state_key(s): v for v, s in values.items()}
    assert set(example.live_states([traj])) == set(value)  # the done state is not estimated
    got = [a for _, a in example.vine_samples([traj], value)]
    # V = 0 gives [0, 0, 1]; a flipped sign [-0.3, -0.4, -0.1]; V(s_{t+1}) shifted by one
    # step [0.7, -0.5, 0.1]; the reward of the next step [0.3, 1.4, 0.1]: none of these.
    assert got == pytest.approx([0.3, 0.4, 0.1])


async def _run(policy: Callable[[GenerationRequest], str], tasks: list[int]) -> list[Trajectory]:
    env = ChainEnv(min_length=3, num_tasks=1, max_steps=3)
    async with env, ScriptedBackend(policy) as backend:
        return await TrajectoryRunner(env, backend, SamplingParams()).run_batch(tasks)


async def test_vine_advantages_blame_the_irrecoverable_first_move(example: ModuleType) -> None:
    # Corridor of 3 in 3 steps: a wasted first move ("left" at 0) can never reach the goal.
    wasted = await _run(lambda r: "left" if r.step == 0 else "right", [0])
    straight = await _run(lambda r: "right", [0])
    assert [t.success for t in wasted + straight] == [False, True]
    env = ChainEnv(min_length=3, num_tasks=1, max_steps=3)
    async with env, ScriptedBackend(lambda r: "right") as backend:  # V under "always right"
        runner = TrajectoryRunner(env, backend, SamplingParams())
        samples, spent = await example.vine_advantages(runner, wasted + straight, rollouts=2)
    # live states: start; after left (0 at step 1), then 1 at step 2; after right 1, then 2
    assert spent == 5 * 2
    advantages = [a for _, a in samples]
    assert advantages[:3] == pytest.approx([-1.0, 0.0, 0.0])  # the first move takes the blame
    assert advantages[3:] == pytest.approx([0.0, 0.0, 0.0])  # on track: nothing to credit


def test_expected_success_is_the_exact_probability() -> None:
    """The recursion against an independent enumeration of every 4-action sequence (a
    listed command, or a wasted action), on chance, on perfect and fatal policies and on a
    random table with mass outside the listed calls."""
    relay = load_example("agent_tasks.py")
    states = relay.reachable()
    assert relay.START in states and frozenset() in states and frozenset({"out"}) in states

    def enumerated(choice: dict[frozenset[str], tuple[float, ...]]) -> float:
        total = 0.0
        for seq in itertools.product(range(4), repeat=relay.MAX_ACTIONS):  # 3 = wasted
            files, p = relay.START, 1.0
            for c in seq:
                probs = choice.get(files, (0.0, 0.0, 0.0))
                p *= probs[c] if c < 3 else 1.0 - sum(probs)
                files = relay.apply(files, c) if c < 3 else files
            total += p * (files == {"out"})
        return total

    uniform = {f: (1 / 3,) * 3 for f in states}
    assert relay.expected_success(uniform) == pytest.approx(13 / 81)
    assert relay.expected_success(uniform) == pytest.approx(relay.chance_success())
    perfect = {f: (0.0, 0.0, 0.0) for f in states}
    perfect |= {relay.START: (1, 0, 0), frozenset({"src", "tmp"}): (0, 1, 0),
                frozenset({"src", "out"}): (0, 0, 1)}  # fmt: skip
    assert relay.expected_success(perfect) == 1.0
    # from a later state: publish-then-remove or remove-then-publish, 2 of 9 pairs
    copied = frozenset({"src", "tmp"})
    assert relay.expected_success(uniform, actions=2, start=copied) == pytest.approx(2 / 9)
    assert relay.expected_success(uniform, actions=1, start=copied) == 0.0
    fatal = {f: (0.0, 0.0, 1.0) if f == relay.START else (1 / 3,) * 3 for f in states}
    assert relay.expected_success(fatal) == 0.0
    rng = random.Random(0)
    for _ in range(5):
        table = {}
        for f in states:
            raw = [rng.random() for _ in range(4)]
            table[f] = tuple(x / sum(raw) for x in raw[:3])  # a quarter-ish wasted
        got = relay.expected_success(table)
        assert 0.0 < got < 1.0 and got == pytest.approx(enumerated(table), abs=1e-12)


def test_the_warm_up_labels_read_the_listing_and_say_nothing_of_the_order(
    example: ModuleType,
) -> None:
    """Over many warm-up steps: each command as often as the others; a command goes with a
    listing that has its input file 7/8 of the time at share 3/4 (the default), 3/4 at
    share 1/2 (1/2, chance, at share 0); and at the start's listing, copying and removing
    the original are equally common (the labels carry no order). Counts are checked within
    ~4 standard errors."""
    relay = load_example("agent_tasks.py")
    files = [frozenset(f) for f in itertools.chain.from_iterable(
        itertools.combinations(("out", "src", "tmp"), k) for k in range(4))] * 3  # fmt: skip
    for share, having in ((0.75, 0.875), (0.5, 0.75), (0.0, 0.5)):
        rng = random.Random(1)
        pairs = [p for _ in range(2000) for p in example.warmup_batch(files, share, rng)]
        commands = [c for _, c in pairs]
        assert [commands.count(c) for c in range(3)] == [12000] * 3  # exactly balanced
        for c, need in enumerate(relay.INPUTS):
            mine = [files[i] for i, k in pairs if k == c]
            assert sum(need in f for f in mine) / len(mine) == pytest.approx(having, abs=0.02)
        at_start = [c for i, c in pairs if files[i] == relay.START]
        copy, remove = at_start.count(0), at_start.count(2)
        assert abs(copy - remove) < 4 * (copy + remove) ** 0.5
        if share:  # the start's listing has src, not tmp: publishing is rarer there
            assert at_start.count(1) < 0.5 * copy


def test_grpo_advantages_are_normalised_within_the_group(example: ModuleType) -> None:
    won, _ = _trajectory(task=0, rewards=[0.0, 1.0])
    lost, _ = _trajectory(task=0, rewards=[0.0, 0.0])
    got = [a for _, a in example.grpo_advantages([won, lost])]
    assert got == pytest.approx([1.0, 1.0, -1.0, -1.0], abs=1e-3)


def test_the_learning_rate_ramps_up_then_decays_to_its_floor(example: ModuleType) -> None:
    cfg = example.Config(lr=1e-3, lr_ramp=5, lr_floor=0.1, steps=60)
    rates = [example.rl_learning_rate(cfg, step) for step in range(1, 61)]
    assert rates[0] == pytest.approx(1e-3 / 5)  # the ramp's first step
    assert rates[4] == pytest.approx(1e-3 * (1 - 0.9 * 4 / 60))  # ramped up, decaying
    assert rates[-1] == pytest.approx(1e-3 * (1 - 0.9 * 59 / 60))  # near the floor at the end
    assert all(a > b for a, b in itertools.pairwise(rates[4:]))  # decays after the ramp
    assert example.rl_learning_rate(cfg, 200) == pytest.approx(1e-4)  # never below the floor
    constant = example.Config(lr=1e-3, lr_ramp=5, lr_floor=1.0, steps=60)
    assert [example.rl_learning_rate(constant, s) for s in (5, 30, 60)] == [1e-3] * 3


def _step(token_ids: list[int], *, malformed: bool) -> Transition:
    traj, _ = _trajectory(task=0, rewards=[0.0])
    tr = traj.transitions[0]
    info = {"parse_error": "not a call"} if malformed else {}
    completion = Completion(text="x", token_ids=tuple(token_ids))
    return Transition(state=tr.state, action=tr.action, next_state=tr.next_state, reward=0.0,
                      completion=completion, info=info)  # fmt: skip


def test_a_malformed_call_is_penalised_only_where_it_left_the_syntax(
    example: ModuleType,
) -> None:
    """The well-formed tokens before the break keep advantage 0: penalising them pushed the
    format itself down (the collapse the docs measure)."""
    calls = [[1, 2, 3, 4, 9], [1, 2, 5, 9]]
    assert example.syntax_break([1, 2, 5, 7, 7], calls) == 3  # left after the 2nd call's prefix
    assert example.syntax_break([8, 8], calls) == 0
    assert example.syntax_break([1, 2], calls) == 1  # cut off: the last token
    broken = example.token_advantages(_step([1, 2, 3, 6, 6], malformed=True), -1.0, calls)
    assert broken == [0.0, 0.0, 0.0, -1.0, 0.0]
    fine = example.token_advantages(_step([1, 2, 3, 4, 9], malformed=False), 0.5, calls)
    assert fine == [0.5] * 5


def test_off_canon_counts_valid_calls_off_the_listed_tokens(example: ModuleType) -> None:
    """A valid call tokenised another way runs in the container but is invisible to
    ``exact_success``; malformed replies are the format-error rate's, not this one's."""
    calls = [[1, 2, 9], [1, 3, 9]]
    steps = [_step([1, 2, 9], malformed=False), _step([1, 3, 9], malformed=False),
             _step([1, 4, 2, 9], malformed=False), _step([7], malformed=True)]  # fmt: skip
    batch = [Trajectory(episode_id=str(i), initial_state=tr.state, transitions=(tr,))
             for i, tr in enumerate(steps)]  # fmt: skip
    assert example.off_canon_rate(batch, calls) == pytest.approx(1 / 3)
    assert example.off_canon_rate(batch[:2], calls) == 0.0
    assert example.off_canon_rate([], calls) == 0.0


_STEP = re.compile(
    r"^\[(\w+) seed \d+\] step +\d+ +success ([\d.]+) +staleness (\d+) .* rollouts +(\d+) +"
    r"format-errors ([\d.]+) +off-canon ([\d.]+) +rm-first ([\d.]+) +clipped ([\d.]+) +"
    r"drift ([\d.]+) +exact ([\d.]+) +p\(rm-first\) ([\d.]+)"
)
_FINAL = re.compile(
    r"^held-out success \((\w+)\): ([\d.]+) -> ([\d.]+) \(exact ([\d.]+) -> ([\d.]+)\)$"
)
_WARM = re.compile(r"^\[(\w+) seed \d+\] after warm-up: .*\(exact ([\d.]+), p\(rm-first\)")


@pytest.mark.vllm
@pytest.mark.docker
@pytest.mark.timeout(900)
def test_quick_run_trains_both_estimators_in_containers(
    vllm_ready: str,  # noqa: F811
    docker_ready: None,
) -> None:
    """The whole loop on the real engine and real containers: a line per step for each
    estimator, staleness within its bound, vine spending value rollouts on top of the
    episodes, both held-out measurements (the exact pair is the warm-up's and the last
    update's), and no container left."""
    example = load_example("train_agent_rl.py")
    cfg = example.Config.quick()
    out = run_example("train_agent_rl.py", "--quick", "--estimator", "both", timeout=840).stdout
    steps: dict[str, list[tuple[int, int]]] = {"grpo": [], "vine": []}
    exact: dict[str, list[str]] = {"grpo": [], "vine": []}
    final = {}
    for line in out.splitlines():
        if m := _WARM.match(line):
            exact[m[1]].append(m[2])
        elif m := _STEP.match(line):
            steps[m[1]].append((int(m[3]), int(m[4])))
            exact[m[1]].append(m[10])
            # shares and probabilities; the drift is a mean |logprob gap|
            assert all(0.0 <= float(m[i]) <= 1.0 for i in (5, 6, 7, 8, 10, 11)), line
            assert float(m[9]) >= 0.0, line
        elif m := _FINAL.match(line):
            final[m[1]] = (m[2], m[3], m[4], m[5])
    assert set(final) == {"grpo", "vine"}, out
    for estimator, (before, after, exact_before, exact_after) in final.items():
        assert all(0.0 <= float(x) <= 1.0 for x in (before, after)), out
        assert (exact_before, exact_after) == (exact[estimator][0], exact[estimator][-1]), out
    episodes = cfg.group_size * cfg.groups_per_step
    for estimator, logged in steps.items():
        assert len(logged) == cfg.steps, out
        assert max(s for s, _ in logged) <= cfg.max_staleness, out
        rollouts = [r for _, r in logged]
        if estimator == "grpo":
            assert rollouts == [episodes * (i + 1) for i in range(cfg.steps)], out
        else:  # the episodes and, per step, at least the start state's value rollouts
            spent = [b - a for a, b in zip([0, *rollouts[:-1]], rollouts, strict=True)]
            assert min(spent) >= episodes + cfg.value_rollouts, out
    assert "containers left: 0" in out


@pytest.mark.vllm
@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_short_run_of_the_loop_improves_the_policy(
    vllm_ready: str,  # noqa: F811
    docker_ready: None,
) -> None:
    """15 GRPO steps through the engine and containers lift the policy's exact held-out
    success well above its warm-up's. Seed 1's warm-up with 3/4 of its labels reading the
    listing starts at 0.36 (chance 0.16); emulated at 16 episodes a step under 7 draws of
    RL's sampling, the last three of 15 steps averaged 0.72-0.89 (docs/agent-rl.md), so the
    asserted gain, 0.2, leaves a margin of 0.16 or more; learning that broke (a flipped
    advantage, no update) would miss it. Those measured settings, not the default's, keep
    the run to ~4 minutes."""
    out = run_example(
        "train_agent_rl.py", "--seed", "1", "--steps", "15", "--eval-per-task", "2",
        "--groups-per-step", "4", "--warmup-reads-listing", "0.75", timeout=840,
    ).stdout  # fmt: skip
    warm = [m for line in out.splitlines() if (m := _WARM.match(line))]
    exact = [float(m[10]) for line in out.splitlines() if (m := _STEP.match(line))]
    assert len(warm) == 1 and len(exact) == 15, out
    start = float(warm[0][2])
    end = sum(exact[-3:]) / 3  # the last three updates: one lucky step does not pass
    assert end >= start + 0.2, (start, exact)
    assert "containers left: 0" in out


@pytest.mark.vllm  # torch and the tiny model
def test_a_loop_checkpoint_restores_the_policy_its_optimizer_and_the_loop(
    example: ModuleType, tmp_path: Path
) -> None:
    """What ``--resume DIR`` saves comes back whole in a fresh policy: weights, Adam's
    moments, the KL reference, the step count, the task sampler and the log."""
    import copy

    import _rl_checkpoint as ckpt  # the example's sibling module (on sys.path once loaded)
    import torch

    from llenvs_async.testing.tiny_model import cached_tiny_model

    model_dir, cfg = str(cached_tiny_model()), example.Config.quick()
    policy = example.AgentPolicy(model_dir, cfg, [example.BASH_TOOL])
    policy.reference = copy.deepcopy(policy.model).requires_grad_(False)
    loss = sum(p.float().pow(2).sum() for p in policy.model.parameters())
    policy.optimizer.zero_grad()
    loss.backward()
    policy.optimizer.step()  # weights moved off the reference, Adam's moments set
    policy.rl_steps = 3
    rng = random.Random(5)
    rng.random()
    result = example.RunResult("grpo", 0, 0.25, after=0.75, exact_before=0.5)  # no NaN
    log = example.StepLog(step=0, success=0.5, staleness=1, versions=(1, 2), failed=0,
                          format_errors=0.0, removed_first=0.1, rollouts=16, seconds=3.0,
                          exact=0.6, rm_prob=0.1)  # fmt: skip
    result.steps.append(log)
    result.curve.append((0, 0, 0.0, 0.25))
    path = ckpt.checkpoint_path(tmp_path, "grpo", 0)
    ckpt.save(path, policy, ckpt.LoopState(1, 2, rng.getstate(), dataclasses.asdict(result)))

    fresh = example.AgentPolicy(model_dir, cfg, [example.BASH_TOOL])
    assert ckpt.load(tmp_path / "absent.pt", fresh) is None
    loop = ckpt.load(path, fresh)
    assert loop is not None and (loop.step, loop.version) == (1, 2) and fresh.rl_steps == 3
    pairs = [
        *zip(policy.model.state_dict().values(), fresh.model.state_dict().values(), strict=True),
        *zip(policy.reference.state_dict().values(), fresh.reference.state_dict().values(),
             strict=True),
    ]  # fmt: skip
    assert all(torch.equal(a, b) for a, b in pairs)
    first = (next(fresh.model.parameters()), next(fresh.reference.parameters()))
    assert not torch.equal(*first)  # the reference is its own copy
    moments = [(s["exp_avg"], t["exp_avg"]) for s, t in zip(
        policy.optimizer.state_dict()["state"].values(),
        fresh.optimizer.state_dict()["state"].values(), strict=True)]  # fmt: skip
    assert moments and all(torch.equal(a, b) for a, b in moments)
    again = random.Random()
    again.setstate(loop.task_rng)
    assert again.random() == rng.random()
    assert example.RunResult.from_dict(loop.result) == result
