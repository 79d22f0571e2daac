"""The token-mode benchmark runs at tiny sizes and produces a well-formed result."""

from __future__ import annotations

from benchmarks import bench_tokens

from .test_benches import check_result


def test_tokens_quick() -> None:
    result = bench_tokens.run(quick=True)
    check_result(result, "tokens")
    per_turn = result["data"]["per_turn"]
    assert [r["turn"] for r in per_turn["token"]] == list(range(1, bench_tokens.QUICK["turns"] + 1))
    assert len(per_turn["retemplate"]) == len(per_turn["token"])
    assert all(r["ms"] > 0 for side in per_turn.values() for r in side)
