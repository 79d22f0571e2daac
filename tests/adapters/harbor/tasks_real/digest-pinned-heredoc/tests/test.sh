#!/bin/bash
if [ "$(cat /task/report.md)" = "$(printf '# Report\nALPHA\nBETA')" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
