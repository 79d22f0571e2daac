#!/bin/bash
# Verifier for fix-shell-script: writes 1 or 0 to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }

script=/app/wordcount.sh
[ -x "$script" ] || fail "$script is not executable"
bash -n "$script" 2>/dev/null || fail "$script has a syntax error"
sample=$(mktemp)
printf 'the quick brown fox\njumps over\n\nthe lazy dog\n' > "$sample"
out=$("$script" "$sample" 2>/dev/null) || fail "$script exited non-zero on a valid file"
[ "$out" = "9 $sample" ] || fail "expected '9 $sample', got '$out'"
"$script" >/dev/null 2>&1
[ $? -eq 2 ] || fail "no arguments should exit with status 2"
"$script" a b >/dev/null 2>&1
[ $? -eq 2 ] || fail "two arguments should exit with status 2"
[ -n "$("$script" 2>&1 >/dev/null)" ] || fail "the usage line should go to stderr"
echo "PASS"
echo 1 > /logs/verifier/reward.txt
