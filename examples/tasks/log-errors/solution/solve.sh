#!/bin/bash
# One command per line: a scripted agent replays these as its actions.
grep -o 'ERROR [A-Z0-9_]*' /app/logs/app.log | cut -d' ' -f2 | sort | uniq -c | sort -k1,1nr -k2,2 | awk '{print $1, $2}' > /app/errors.txt
cat /app/errors.txt
