#!/bin/bash
set -euo pipefail
mkdir -p /app/out
awk '{s += $1} END {print s}' /app/numbers.txt > /app/out/total.txt
echo "scratch work" > /app/out/scratch.tmp
echo "stays in the agent's container" > /app/not-an-artifact.txt
