#!/bin/bash
# One command per line: a scripted agent replays these as its actions.
echo "region,total" > /app/totals.csv
awk -F, 'NR > 1 { total[$1] += $3 } END { for (r in total) printf "%s,%.2f\n", r, total[r] }' /app/sales.csv | sort >> /app/totals.csv
cat /app/totals.csv
