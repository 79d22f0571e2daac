#!/bin/bash
# Usage: wordcount.sh FILE -> prints "<words> <FILE>"
if [ $# -ne 1 ]; then
  echo "usage: $0 FILE" >&2
  exit 2

words=$(wc -c < "$1")
echo "$words $1"
