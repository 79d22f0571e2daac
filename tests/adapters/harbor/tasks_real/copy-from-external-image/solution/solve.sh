#!/bin/bash
uv --version > /app/uv.txt
