#!/bin/bash
if [ "$(cat /workspace/sum.txt)" = 12 ] && python3 -m pip --version >/dev/null; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
