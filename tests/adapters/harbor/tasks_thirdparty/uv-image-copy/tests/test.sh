#!/bin/bash
if uv --version | grep -q '^uv 0\.9\.5' && [ -x /bin/uvx ] && [ "$(cat /app/answer.txt)" = 42 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
