#!/bin/bash
if [ "$(cat /app/a.txt)" = 7 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
