#!/bin/bash
# One command per line: a scripted agent replays these as its actions.
sed -i 's/^  exit 2$/  exit 2\nfi/' /app/wordcount.sh
sed -i 's/wc -c/wc -w/' /app/wordcount.sh
chmod +x /app/wordcount.sh
