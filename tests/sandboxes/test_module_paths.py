"""Where the sandboxes live: `pivot_envs.sandboxes`, outside the core."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_core_does_not_import_the_sandboxes():
    code = "import sys, pivot_envs; print(sorted(m for m in sys.modules if 'sandbox' in m))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
