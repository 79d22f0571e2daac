#!/bin/bash
# Verifier for log-errors: writes 1 or 0 to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }

[ -f /app/errors.txt ] || fail "/app/errors.txt is missing"
diff <(sed 's/[[:space:]]*$//' /app/errors.txt) /tests/expected_errors.txt || fail "/app/errors.txt differs (diff above)"
echo "PASS"
echo 1 > /logs/verifier/reward.txt
