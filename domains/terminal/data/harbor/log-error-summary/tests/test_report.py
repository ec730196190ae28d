"""The report counts ERROR lines per component over /app/logs/*.log, most frequent first; the logs are kept."""

import pathlib
import sys

EXPECTED = ["db 4", "auth 2", "http 1", "queue 1"]
LOG_LINES = {"api.log": 8, "worker.log": 6}

for name, count in LOG_LINES.items():
    log = pathlib.Path("/app/logs") / name
    if not log.is_file() or len(log.read_text().splitlines()) != count:
        sys.exit(f"FAIL: /app/logs/{name} was changed or removed")
report = pathlib.Path("/app/report.txt")
if not report.is_file():
    sys.exit("FAIL: /app/report.txt does not exist")
lines = [line.strip() for line in report.read_text().splitlines() if line.strip()]
if lines != EXPECTED:
    sys.exit(f"FAIL: the report is {lines}, expected {EXPECTED}")
print("PASS: /app/report.txt is right")
