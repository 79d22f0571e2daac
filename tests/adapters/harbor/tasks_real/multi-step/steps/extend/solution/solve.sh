#!/bin/bash
cat /app/next-word.txt >> /app/f
