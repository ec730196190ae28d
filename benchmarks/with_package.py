"""Run a benchmark against another version of pivot_envs, for A/B figures in one session.

    git worktree add /tmp/old <commit>
    mkdir -p /tmp/oldpkg && cp -r /tmp/old/pivot_envs /tmp/oldpkg/
    for d in adapters domains sandboxes; do ln -s /tmp/old/$d /tmp/oldpkg/pivot_envs/$d; done
    cd /tmp && /path/to/.venv/bin/python /path/to/benchmarks/with_package.py /tmp/oldpkg \\
        /tmp/old/benchmarks/terminal_reset_step.py --rounds 5

The venv's editable install maps pivot_envs.adapters, .domains and .sandboxes to this checkout
whatever PYTHONPATH says (its finder is on sys.meta_path); this takes that finder off, so
PKG_PARENT/pivot_envs, with its links to the old adapters, domains and sandboxes, is what loads.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: with_package.py PKG_PARENT SCRIPT [ARGS...]")
    package_parent, script, *args = sys.argv[1:]
    sys.meta_path[:] = [
        finder for finder in sys.meta_path if "editable" not in type(finder).__module__.lower()
    ]
    for name in [name for name in sys.modules if name == "pivot_envs" or name.startswith("pivot_envs.")]:
        del sys.modules[name]
    sys.path[:0] = [package_parent, os.path.dirname(os.path.abspath(script))]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
