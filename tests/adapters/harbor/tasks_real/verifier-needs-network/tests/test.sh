#!/bin/bash
# Real tasks fetch uv/pytest here; offline that fails before any check runs.
python3 -c "import urllib.request; urllib.request.urlopen('https://astral.sh/uv/install.sh', timeout=10)" || exit 1
if [ -f /app/ready ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
