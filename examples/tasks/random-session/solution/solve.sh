#!/bin/bash
# One command per line: a scripted agent replays these as its actions.
mkdir -p /app/session
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > /app/session/token.txt
echo $RANDOM > /app/session/seed.txt
date -u +%Y-%m-%dT%H:%M:%SZ > /app/session/created.txt
mktemp -d /app/session/scratch.XXXXXX > /app/session/scratch_path.txt
