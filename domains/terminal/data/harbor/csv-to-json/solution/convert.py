"""The oracle: CSV rows to a JSON list, ages as numbers, inactive rows skipped."""

import csv
import json
import sys

source, target = sys.argv[1:3]
with open(source, newline="") as file:
    rows = [dict(row, age=int(row["age"])) for row in csv.DictReader(file) if row["active"] != "no"]
with open(target, "w") as file:
    json.dump(rows, file, indent=2)
