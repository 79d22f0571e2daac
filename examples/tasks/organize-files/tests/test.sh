#!/bin/bash
# Verifier for organize-files: writes 1 or 0 to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }

expect_file() { # PATH CONTENT
    [ -f "$1" ] || fail "$1 is missing"
    [ "$(cat "$1")" = "$2" ] || fail "$1 has the wrong content"
}
expect_file /app/docs/todo.txt "$(printf 'buy milk\ncall the bank')"
expect_file /app/docs/notes.txt "meeting moved to friday"
expect_file /app/data/stock.csv "$(printf 'name,qty\napple,3\npear,5')"
expect_file /app/data/report.csv "$(printf 'month,total\njan,10\nfeb,12')"
expect_file /app/inbox/README.md "$(printf '# Inbox\nKeep me here.')"
[ -z "$(find /app -name '*.tmp')" ] || fail ".tmp files remain: $(find /app -name '*.tmp')"
[ "$(ls -A /app/inbox)" = "README.md" ] || fail "/app/inbox holds more than README.md: $(ls -A /app/inbox)"
[ "$(ls -A /app/docs | wc -l)" -eq 2 ] || fail "/app/docs should hold exactly the two .txt files"
[ "$(ls -A /app/data | wc -l)" -eq 2 ] || fail "/app/data should hold exactly the two .csv files"
echo "PASS"
echo 1 > /logs/verifier/reward.txt
