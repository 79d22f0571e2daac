#!/bin/bash
if grep -qx "x = 1" /app/out.toml; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
