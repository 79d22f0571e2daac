#!/bin/bash
# Verifier for random-session: checks formats, not values (they are random).
mkdir -p /logs/verifier
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }

s=/app/session
[ -d "$s" ] || fail "$s is missing"
grep -Eqx '[0-9a-f]{32}' "$s/token.txt" 2>/dev/null || fail "token.txt must hold 32 lowercase hex characters"
grep -Eqx '[0-9]+' "$s/seed.txt" 2>/dev/null || fail "seed.txt must hold an integer"
grep -Eqx '[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z' "$s/created.txt" 2>/dev/null \
    || fail "created.txt must look like 2024-01-31T12:00:00Z"
scratch=$(cat "$s/scratch_path.txt" 2>/dev/null)
case "$scratch" in /app/session/scratch.??????) ;; *) fail "scratch_path.txt holds '$scratch'" ;; esac
[ -d "$scratch" ] || fail "the scratch directory $scratch does not exist"
[ "$(find "$s" -maxdepth 1 -name 'scratch.*' -type d | wc -l)" -eq 1 ] || fail "expected exactly one scratch dir"
echo "PASS"
echo 1 > /logs/verifier/reward.txt
