#!/bin/bash
echo one > /app/f
