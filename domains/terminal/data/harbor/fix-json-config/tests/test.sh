#!/bin/bash
mkdir -p /logs/verifier
python3 /tests/test_config.py && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
