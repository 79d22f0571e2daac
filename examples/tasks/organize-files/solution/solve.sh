#!/bin/bash
# One command per line: a scripted agent replays these as its actions.
mkdir -p /app/docs /app/data
mv /app/inbox/*.txt /app/docs/
mv /app/inbox/*.csv /app/data/
rm -f /app/inbox/*.tmp
