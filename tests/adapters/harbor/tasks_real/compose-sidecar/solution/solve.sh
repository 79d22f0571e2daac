#!/bin/bash
echo set k v
