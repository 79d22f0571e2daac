#!/bin/bash
echo three >> /app/f
