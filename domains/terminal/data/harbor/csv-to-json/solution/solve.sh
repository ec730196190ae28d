#!/bin/bash
set -e
python3 /solution/convert.py "$DATA_DIR/people.csv" /app/people.json
