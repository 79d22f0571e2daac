#!/bin/bash
# Runs in the separate verifier container: only /logs/artifacts and the declared artifacts arrive.
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ "$(cat /etc/llenvs-role 2>/dev/null)" = verifier ] || fail "not running in the verifier image"
[ -f /app/numbers.txt ] || fail "artifact /app/numbers.txt did not arrive"
[ -e /app/not-an-artifact.txt ] && fail "a file that is no artifact crossed over"
[ -e /app/out/scratch.tmp ] && fail "an excluded file (*.tmp) crossed over"
[ "$(tr -d ' ' < /logs/artifacts/lines.txt)" = 3 ] || fail "the collect hook's output is missing"
expected=$(awk '{s += $1} END {print s}' /app/numbers.txt)
[ "$(cat /app/out/total.txt 2>/dev/null)" = "$expected" ] || fail "total.txt is not $expected"
echo PASS
echo 1 > /logs/verifier/reward.txt
