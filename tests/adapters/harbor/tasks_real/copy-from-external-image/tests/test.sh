#!/bin/bash
if grep -q uv /app/uv.txt; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
