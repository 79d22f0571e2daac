"""The relay-loop emulation's advantages: the credit each estimator gives a known batch."""

from __future__ import annotations

import random

import pytest

from benchmarks import emulate_agent_rl as emu

relay = emu.relay
UNIFORM = {f: (1 / 3,) * 3 for f in relay.reachable()}
COPY, PUBLISH, REMOVE = 0, 1, 2
WON = ([(relay.START, COPY), (frozenset({"src", "tmp"}), PUBLISH),
        (frozenset({"src", "out"}), REMOVE), (frozenset({"out"}), COPY)], 1.0)  # fmt: skip
LOST = ([(relay.START, REMOVE), (frozenset(), COPY), (frozenset(), PUBLISH),
         (frozenset(), REMOVE)], 0.0)  # fmt: skip


def test_vine_with_exact_values_blames_the_first_remove_and_credits_the_copy() -> None:
    batch = [("amber", [WON, LOST])]
    out = emu.advantages(batch, "vine", {"amber": UNIFORM}, 0, random.Random(0))
    by_step = [(f, c, a) for _, f, c, a in out]
    assert len(by_step) == 8
    (_, _, copy_first), (_, _, remove_first) = by_step[0], by_step[4]
    assert copy_first > 0 > remove_first  # V(start) is 13/81; after rm it is 0
    # after the remove nothing can change the outcome: zero credit
    assert [a for _, _, a in by_step[5:]] == pytest.approx([0.0, 0.0, 0.0])
    # the step after success (every command fails) earns nothing either
    assert by_step[3][2] == pytest.approx(0.0)
    # the raw TD error of the first remove is -V(start), before whitening
    raw_first_remove = -relay.expected_success(UNIFORM)
    scale = remove_first / raw_first_remove
    assert scale > 0 and copy_first / scale == pytest.approx(
        relay.expected_success(UNIFORM, 3, frozenset({"src", "tmp"})) - 13 / 81
    )


def test_grpo_credits_every_step_of_an_episode_alike() -> None:
    out = emu.advantages([("amber", [WON, LOST])], "grpo", {}, 0, random.Random(0))
    assert [a for *_, a in out] == pytest.approx([1.0] * 4 + [-1.0] * 4, abs=1e-3)


def test_a_reply_off_the_listed_calls_gets_the_format_penalty_under_both_estimators() -> None:
    won = ([(relay.START, None), *WON[0][:3]], 1.0)  # the wasted first action, then a win
    for estimator in ("grpo", "vine"):
        out = emu.advantages([("amber", [won, LOST])], estimator, {"amber": UNIFORM}, 0,
                             random.Random(0))  # fmt: skip
        assert out[0][2] is None
        assert out[0][3] == emu.loop.FORMAT_ADVANTAGE
        assert out[1][3] > 0  # the copy after it still gets credit


def test_an_off_call_reply_is_sampled_from_the_model_and_is_none_of_the_calls() -> None:
    from llenvs_async.testing.tiny_model import cached_tiny_model

    policy = emu.loop.AgentPolicy(str(cached_tiny_model()), emu.loop.Config(), [emu.loop.BASH_TOOL])
    prompt = policy.prompt_ids(emu.loop.state_prompt("amber", relay.START))
    reply = emu.off_call_reply(policy, prompt, random.Random(0))
    assert reply is not None and reply not in policy.calls  # an untrained model: mostly off
    assert reply == emu.off_call_reply(policy, prompt, random.Random(0))  # seeded


def test_with_a_policy_that_tells_states_apart_monte_carlo_credit_learns_in_fewer_steps() -> None:
    """The tabular control (seeded, pure Python: deterministic): at the same step size, vine
    with exact values reaches held-out 0.7 in fewer steps than GRPO, seed by seed, and both
    improve on chance (13/81)."""

    def steps_to(estimator: str, seed: int) -> int:
        args = emu.argparse.Namespace(estimator=estimator, K=0, steps=25, lr=2.0, groups=4,
                                      group_size=4)  # fmt: skip
        curve = emu.run_tabular(args, seed)
        assert curve[0] == pytest.approx(13 / 81) and curve[-1] > 0.5
        return next(i for i, x in enumerate(curve) if x >= 0.7)

    for seed in range(5):
        assert steps_to("vine", seed) < steps_to("grpo", seed)


def test_more_names_than_the_list_has_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asking for more train names than exist fails naming the flag and value, instead of
    silently training on fewer."""
    too_many = len(emu.MORE_NAMES) + 1
    argv = ["emulate_agent_rl.py", "--policy", "tabular", "--steps", "0", "--seeds", "0"]
    monkeypatch.setattr("sys.argv", [*argv, "--more-names", str(too_many)])
    with pytest.raises(SystemExit) as exit_info:
        emu.main()
    assert exit_info.value.code == 2
    assert f"--more-names: {too_many} is not in 0..{len(emu.MORE_NAMES)}" in capsys.readouterr().err


def test_warmup_seed_sets_the_warm_ups_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--warmup-seed`` sets the warm-up's draw (its listings and label order), so
    crossing it with ``--seeds`` tells a warm-up's effect from RL's."""
    seen: list[tuple[int, list[str]]] = []

    def record(policy: emu.loop.AgentPolicy, observations: list[str]) -> float:
        seen.append((policy.cfg.seed, observations))
        return 0.0  # the warm-up's draw is what is checked, not its training

    monkeypatch.setattr(emu.loop.AgentPolicy, "warm_up", record)
    for warmup_seed, expected in ((None, 3), (5, 5)):
        args = emu.argparse.Namespace(lr=3e-4, lr_floor=0.1, reads_listing=0.5, more_names=0,
                                      steps=0, warmup_seed=warmup_seed,
                                      estimator="grpo")  # fmt: skip
        emu.run(args, 3)
        assert seen[-1] == (expected, emu.loop.warmup_observations(relay.TRAIN_NAMES, expected))
    assert seen[0][1] != seen[1][1]
