#!/bin/bash
python3 -m pip install --break-system-packages -q pytest==8.4.1 2>/dev/null || true
python3 -m pytest /tests/test_outputs.py -rA

if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
