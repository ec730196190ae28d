"""Keystroke actions (`{"command": ..., "keys": true}`, run in the interactive shell) are bounded as
commands are (boundary audit F8): their output is cut to the output limit, and the disk check
watches what the keys start. Both backends (the `kind` fixture)."""

from __future__ import annotations

import json
import time

from pivot_envs.domains.terminal import TerminalEnv
from pivot_envs.sandboxes.output import cut_marker

PIVOT = "terminal/awk-average/t1"


def keys(text: str) -> dict:
    arguments = json.dumps({"command": text, "keys": True})
    return {
        "role": "assistant",
        "tool_calls": [{"id": "k", "function": {"name": "bash", "arguments": arguments}}],
    }


def test_keystrokes_that_print_without_end_return_at_most_the_output_limit(kind):
    env = TerminalEnv(sandbox=kind, limits={"timeout": 5.0})
    try:
        env.reset(options={"pivot": PIVOT})
        _, _, _, _, info = env.step(keys("yes\r"))
        output = info["output"]["output"]
        # Before: everything the terminal showed in the action's second (600k-1M characters).
        assert len(output) <= env.limits.output_bytes + len(cut_marker(10**12)), len(output)
        assert info["output"]["truncated"] > 0 and "bytes of output cut" in output
        assert output.startswith("y\ny\n") and output.rstrip().endswith("y")  # the head and the tail
    finally:
        env.close()


def test_a_keystroke_write_loop_is_stopped_by_the_disk_limit(kind):
    env = TerminalEnv(sandbox=kind, limits={"timeout": 5.0, "disk_mb": 20})
    try:
        env.reset(options={"pivot": PIVOT})
        # written, not fallocated: bubblewrap's seccomp filter refuses fallocate (test_seccomp.py)
        loop = "for i in $(seq 12); do head -c 50M /dev/zero > /tmp/k$i; echo made-$i; sleep 0.05; done\r"
        start = time.monotonic()
        _, _, _, _, info = env.step(keys(loop))
        output = info["output"]["output"]
        # Before: nothing checked the disk, the loop wrote its twelve files (600 MB).
        assert "disk limit (20 MB)" in output and info["output"]["exit_code"] == 137, output
        assert "made-12" not in output, output
        assert time.monotonic() - start < 10
    finally:
        env.close()
