#!/bin/bash
# Staged before the step's agent turn: the word to append.
set -e
printf 'two\n' > /app/next-word.txt
