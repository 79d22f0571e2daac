#!/bin/bash
# The check is right on the Python the task names; a stand-in with another fails it.
if python3 -c 'import sys; assert sys.version_info >= (3, 12), sys.version' && \
   [ "$(cat /app/answer.txt)" = 42 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
