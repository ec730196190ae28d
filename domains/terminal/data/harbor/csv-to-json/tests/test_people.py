"""people.json holds the active rows with numeric ages; the reward goes to /logs/verifier/reward.json."""

import json
import os

EXPECTED = [
    {"name": "Ada Lovelace", "age": 36, "city": "London", "active": "yes"},
    {"name": "Hopper, Grace", "age": 85, "city": "New York", "active": "yes"},
    {"name": "Edsger Dijkstra", "age": 72, "city": "Nuenen", "active": "yes"},
    {"name": "Barbara Liskov", "age": 84, "city": "Boston", "active": "yes"},
]
try:
    with open("/app/people.json") as file:
        rows = json.load(file)
except (OSError, ValueError) as error:
    rows, problem = None, f"people.json does not parse: {error}"
else:
    problem = "" if rows == EXPECTED else f"people.json is {rows}"
matched = sum(1 for a, b in zip(rows or [], EXPECTED) if a == b) if isinstance(rows, list) else 0
print(problem or "PASS")
with open("/logs/verifier/reward.json", "w") as file:
    json.dump(
        {
            "reward": 0.0 if problem else 1.0,
            "rows_matched": matched,
            "rows_expected": int(os.environ["EXPECTED_ROWS"]),
        },
        file,
    )
