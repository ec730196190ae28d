"""`pivotrl profile` and `pivotrl eval` against a scripted chat server, for the domains' end-to-end tests.

The server (a `ChatCompletionsStub`) answers sample j at a pivot with the expert's step rewritten
(j even) or "I do not know" (j odd); these helpers run the real command on it and check what every
domain shares, leaving each test the checks of its own domain.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from chat_completions_stub import ChatCompletionsStub

from pivot_envs.cli import main
from pivot_envs.pivot import Pivot, read_pivots, write_pivots


def profile_scripted(
    server: ChatCompletionsStub,
    pivots: list[Pivot],
    tmp_path: Path,
    strict_agrees: Callable[[Pivot], bool],
    *flags: str,
) -> None:
    """Profile `pivots` with k=4 on `server`: the even samples score 1, the strict verifier agrees
    on them only where `strict_agrees(pivot)`, and the profiled file keeps the pivots' order."""
    candidates, out = tmp_path / "candidates.jsonl", tmp_path / "profiled.jsonl"
    write_pivots(pivots, candidates)
    policy = f"openai:{server.url}#scripted"
    argv = [
        "profile",
        str(candidates),
        "--policy",
        policy,
        "--out",
        str(out),
        "--k",
        "4",
        "--progress",
        "false",
    ]
    assert main([*argv, *flags]) == 0
    profiled = read_pivots(out)
    assert [p.id for p in profiled] == [p.id for p in pivots]
    for pivot in profiled:
        assert pivot.profile.rewards == [1.0, 0.0, 1.0, 0.0], (pivot.id, pivot.profile.categories)
        strict = [1.0, 0.0, 1.0, 0.0] if strict_agrees(pivot) else [0.0] * 4
        assert pivot.profile.strict_rewards == strict and pivot.profile.var == 0.25


def eval_scripted(server: ChatCompletionsStub, pivots: list[Pivot], tmp_path: Path, *flags: str) -> dict:
    """Evaluate `pivots` greedily on `server`; the report's rows by (domain, mode)."""
    path, report = tmp_path / "heldout.jsonl", tmp_path / "report.json"
    write_pivots(pivots, path)
    policy = f"openai:{server.url}#scripted"
    assert main(["eval", "--pivots", str(path), "--policy", policy, *flags, "--json", str(report)]) == 0
    return {(row["domain"], row["mode"]): row for row in json.loads(report.read_text())["rows"]}
