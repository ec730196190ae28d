"""`pivotrl profile --policy vllm:smollm2` end to end on CPU: the command as a user runs it, tiny.

Two bundled tau-bench airline candidates (their system prompt shortened and only the expert's
tools kept, so the prompts are a few hundred tokens), K=2, 8 new tokens: the vLLM engine samples,
the tool-use env scores, the profiles name the vLLM reference.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pivot_envs.pivot import read_pivots, write_pivots

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (make setup)"
)

SCRIPT = Path(sys.executable).parent / "pivotrl"


def short_candidates(path: Path, count: int = 2) -> Path:
    from pivot_envs.domains.tool_use.env import short_bundled_pivots

    write_pivots(short_bundled_pivots(count), path)
    return path


def test_pivotrl_profile_with_the_vllm_policy_profiles_every_candidate(tmp_path):
    candidates, out = short_candidates(tmp_path / "candidates.jsonl"), tmp_path / "profiled.jsonl"
    command = [str(SCRIPT), "profile", str(candidates), "--policy", "vllm:smollm2", "--out", str(out)]
    command += ["--k", "2", "--max-new-tokens", "8", "--seed", "0", "--noprogress"]
    # Unbound OpenMP threads: the test machine's cores are shared, and a thread pinned to a busy core waits.
    environment = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    profiled = read_pivots(out)
    assert [p.id for p in profiled] == [p.id for p in read_pivots(candidates)]
    for pivot in profiled:
        assert pivot.profile.k == 2 and len(pivot.profile.rewards) == 2
        assert pivot.profile.valid == [True, True], pivot.profile.errors
        assert len(pivot.profile.actions) == 2
        assert pivot.profile.settings["reference"] == "vllm:smollm2"
    assert "zero-variance" in done.stdout
