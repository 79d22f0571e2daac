#!/bin/bash
# Verifier for csv-totals: writes 1 or 0 to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }

[ -f /app/totals.csv ] || fail "/app/totals.csv is missing"
diff <(tr -d '\r' < /app/totals.csv) /tests/expected_totals.csv || fail "/app/totals.csv differs (diff above)"
echo "PASS"
echo 1 > /logs/verifier/reward.txt
