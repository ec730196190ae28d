"""Reliability report: the hostile, fuzz, fault and concurrency suites, tabulated per backend.

    .venv/bin/python benchmarks/reliability.py [--families hostile,fuzz,fault,concurrency]

Runs the test suites that attack the library (pytest, in this process) and prints, for each suite
family and backend, "probe | tried | handled | failures": a probe is one test case (one hostile
command, one fuzz property with its fixed example budget, one fault, one concurrency run) and is
handled when its test passed. Then the leftovers on the host (sandbox processes, containers and
images, temporary directories, cgroups) before and after, which must be equal. Writes
benchmarks/out/reliability.json. Target: every row 100% handled, zero leftovers, and the profile
resume tests (nothing lost or doubled) among the faults.

The baseline, in the same run: the same hostile probes with the bubblewrap sandbox's cgroup
turned off (`--baseline`), to show which probes only the cgroup holds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out" / "reliability.json"

# Suite family -> the test files (repository-relative) that make it up; a missing file is reported.
FAMILIES: dict[str, list[str]] = {
    "hostile": ["tests/sandboxes/test_safety.py", "tests/domains/tool_use/test_tool_use_limits.py"],
    "fuzz": [
        "tests/core/test_env_fuzz.py",
        "tests/domains/tool_use/test_tool_use_fuzz.py",
        "tests/domains/terminal/test_terminal_fuzz.py",
    ],
    "fault": [
        "tests/sandboxes/test_reaping.py",
        "tests/core/test_profile_resume.py",
        "tests/domains/tool_use/test_tool_use_http.py",
    ],
    "concurrency": ["tests/sandboxes/test_ownership.py"],
}
_BACKEND = re.compile(r"\b(bwrap|docker)\b")


def backend_of(nodeid: str) -> str:
    """The backend a test case ran on: its bwrap/docker parameter, else its domain folder."""
    params = nodeid.partition("[")[2]
    found = _BACKEND.search(params) or _BACKEND.search(nodeid.partition("::")[2])
    if found:
        return found.group(1)
    path = nodeid.partition("::")[0]
    if "/tool_use/" in path:
        return "tool-use"
    if "/terminal/" in path:
        return "terminal"
    if "/sandboxes/" in path:
        return "sandboxes"
    return "core"


class Collector:
    """A pytest plugin that keeps each test case's outcome (the call phase, or a failed set-up)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, tuple[str, str]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            detail = report.longreprtext.strip().splitlines()[-1][:200] if report.longreprtext.strip() else ""
            previous = self.outcomes.get(report.nodeid)
            if previous is None or previous[0] == "passed":
                self.outcomes[report.nodeid] = (report.outcome, detail)


def run_family(files: list[str], extra: list[str]) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """Run the family's test files; returns {nodeid: (outcome, detail)} and the files missing."""
    present = [f for f in files if (ROOT / f).is_file()]
    missing = [f for f in files if f not in present]
    collector = Collector()
    if present:
        pytest.main(
            ["-q", "-p", "no:cacheprovider", "--no-header", "-rN", *extra, *[str(ROOT / f) for f in present]],
            plugins=[collector],
        )
    return collector.outcomes, missing


def leftovers() -> dict[str, int]:
    """What sandboxes could leave on the host (the safety suite's own count, plus cgroups)."""
    spec = importlib.util.spec_from_file_location("safety", ROOT / "tests/sandboxes/test_safety.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.leftovers()


def table(rows: list[dict]) -> str:
    lines = [
        "| family | backend | probes tried | handled | failures | skipped |",
        "|---|---|---:|---:|---|---:|",
    ]
    for row in rows:
        failures = "; ".join(row["failures"]) or "0"
        lines.append(
            f"| {row['family']} | {row['backend']} | {row['tried']} | "
            f"{row['handled']} ({row['handled_pct']:.0f}%) | {failures} | {row['skipped']} |"
        )
    return "\n".join(lines)


def summarize(family: str, outcomes: dict[str, tuple[str, str]]) -> list[dict]:
    by_backend: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for nodeid, (outcome, detail) in outcomes.items():
        by_backend[backend_of(nodeid)].append((nodeid, outcome, detail))
    rows = []
    for backend, cases in sorted(by_backend.items()):
        tried = [c for c in cases if c[1] != "skipped"]
        handled = [c for c in tried if c[1] == "passed"]
        rows.append(
            {
                "family": family,
                "backend": backend,
                "tried": len(tried),
                "handled": len(handled),
                "handled_pct": 100.0 * len(handled) / len(tried) if tried else 0.0,
                "failures": [f"{c[0].split('::')[-1]}: {c[2]}" for c in tried if c[1] != "passed"],
                "skipped": len(cases) - len(tried),
            }
        )
    return rows


def baseline_without_cgroup() -> dict:
    """The two whole-sandbox probes on bubblewrap with the cgroup off (rlimits only), in a subprocess."""
    code = (
        "import json, shlex\n"
        "import pivot_envs.sandboxes.bwrap_backend as b\n"
        "b.sandbox_cgroup = lambda limits: None\n"
        "from pivot_envs.domains.terminal import TerminalEnv, bundled_pivots\n"
        "from pivot_envs.sandboxes import SandboxLimits\n"
        "env = TerminalEnv([p for p in bundled_pivots() if p.id == 'terminal/count-error-lines/t1'], sandbox='bwrap',\n"
        "                  limits=SandboxLimits(timeout=2.0, processes=64, memory_mb=512), warm_pool=1)\n"
        "from importlib.util import spec_from_file_location, module_from_spec\n"
        "spec = spec_from_file_location('safety', 'tests/sandboxes/test_safety.py')\n"
        "safety = module_from_spec(spec); spec.loader.exec_module(safety)\n"
        "env.reset(options={'index': 0})\n"
        "output = env.sandbox.run('python3 -c ' + shlex.quote(safety.MEMORY_BOMB), timeout=20).output\n"
        "holding = [int(l.split()[1]) for l in output.split('\\n') if l.startswith('HOLDING ')]\n"
        "env.close()\n"
        "print(json.dumps({'memory_bomb_processes_holding_200MB': holding[0] if holding else None}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": result.stderr[-500:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--families", default=",".join(FAMILIES), help="comma-separated suite families to run"
    )
    parser.add_argument(
        "--baseline", action="store_true", help="also run the memory bomb with bubblewrap's cgroup off"
    )
    args, extra = parser.parse_known_args()
    chosen = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {sorted(FAMILIES)}")

    before = leftovers()
    started = time.perf_counter()
    rows, missing = [], []
    for family in chosen:
        outcomes, absent = run_family(FAMILIES[family], extra)
        rows += summarize(family, outcomes)
        missing += absent
    seconds = time.perf_counter() - started
    deadline = time.monotonic() + 10
    while (after := leftovers()) != before and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {key: after.get(key, 0) - before.get(key, 0) for key in sorted(set(before) | set(after))}
    report = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "seconds": round(seconds, 1),
        "rows": rows,
        "missing_files": missing,
        "leftovers_added": left,
        "all_handled": all(row["handled"] == row["tried"] for row in rows) and bool(rows),
        "no_leftovers": all(value <= 0 for key, value in left.items() if key != "zombies"),
    }
    if args.baseline:
        report["baseline_without_cgroup"] = baseline_without_cgroup()

    print(table(rows))
    print(f"\nleftovers added (after - before): {left}")
    if missing:
        print(f"test files not found (not counted): {missing}")
    if "baseline_without_cgroup" in report:
        print(
            f"baseline, bubblewrap without its cgroup: {report['baseline_without_cgroup']} "
            "(with it: at most 2 of 8 processes hold 200 MB under a 512 MB limit)"
        )
    print(
        f"\n{sum(r['tried'] for r in rows)} probes in {seconds:.0f} s; all handled: {report['all_handled']}; "
        f"no leftovers: {report['no_leftovers']}"
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2))
    return 0 if report["all_handled"] and report["no_leftovers"] else 1


if __name__ == "__main__":
    sys.exit(main())
