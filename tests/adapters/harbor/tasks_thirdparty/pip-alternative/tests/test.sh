#!/bin/bash
pip install --quiet --no-cache-dir pytest==8.4.1 2>/dev/null || \
    pip install --quiet --no-cache-dir --break-system-packages pytest==8.4.1
python3 -m pytest /tests/test_outputs.py -rA

if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
