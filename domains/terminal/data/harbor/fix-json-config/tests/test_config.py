"""config.json parses, keeps its settings with port 8080, and the backup is the original."""

import json
import sys

try:
    with open("/srv/service/config.json") as file:
        config = json.load(file)
except (OSError, ValueError) as error:
    sys.exit(f"FAIL: config.json does not parse: {error}")
expected = {
    "name": "inventory",
    "port": 8080,
    "workers": 4,
    "features": ["search", "export"],
    "database": {"host": "db.internal", "pool": 10},
}
if config != expected:
    sys.exit(f"FAIL: config.json is {config}, expected {expected}")
with open("/srv/service/backups/config.json.orig") as file:
    if '"port": 8000' not in file.read():
        sys.exit("FAIL: the backup was changed")
print("PASS")
