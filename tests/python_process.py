"""Running a snippet of code in a fresh Python process: what a user's own script sees, with nothing the
test process already imported or registered."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def run_python(code: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` (dedented) with this interpreter in `cwd`; its exit status and captured text output."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
