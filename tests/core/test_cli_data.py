"""The data commands: extract, stats, export, filter, split (in-process, and extract once as a real process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pivot_envs.cli import main
from pivot_envs.formats import read_as_pivots
from pivot_envs.pivot import Pivot, Profile, read_pivots, write_pivots

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_extract_writes_candidates_and_reports_counts_and_problems(
    shared_data: Path, tmp_path: Path, capsys
) -> None:
    broken = tmp_path / "broken.jsonl"
    good = {
        "id": "chat-1",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    }
    broken.write_text(json.dumps(good) + "\n{not json\n")
    rollouts = shared_data / "nemo_gym" / "swe_bash_rollouts.jsonl"
    rows = shared_data / "nemo_gym" / "swe_pivots.jsonl"
    out = tmp_path / "out" / "candidates.jsonl"
    code = main(["extract", str(rollouts), str(rows), str(broken), "--domain", "swe", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0
    expected = len(read_as_pivots(rollouts)) + 5 + 1
    written = read_pivots(out)
    assert len(written) == expected and all(p.domain == "swe" for p in written)
    assert f"{broken}:2: invalid JSON" in captured.err
    assert f"pivots written: {expected}" in captured.out
    assert "records read: 12" in captured.out and "skipped (malformed): 1" in captured.out


def test_extract_flags_come_from_extract_config(shared_data: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "calls.jsonl"
    path = shared_data / "nemo_gym" / "single_step_tool_use_parallel_pivots.jsonl"
    assert (
        main(
            [
                "extract",
                str(path),
                "--out",
                str(out),
                "--message-turns",
                "false",
                "--multi-call-turns",
                "false",
            ]
        )
        == 0
    )
    kept = read_pivots(out)
    assert [len(p.expert["tool_calls"]) for p in kept] == [1]  # 3 parallel and 1 message row filtered out
    assert "multi-call turn (multi_call_turns is off): 3" in capsys.readouterr().out


def _profiled(tmp_path: Path) -> Path:
    def pivot(pid: str, rewards: list[float], command: str) -> Pivot:
        call = {
            "id": "c",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        }
        return Pivot(
            pid,
            "terminal",
            [{"role": "user", "content": "task"}],
            {"role": "assistant", "content": None, "tool_calls": [call]},
            source={"trajectory": pid.rsplit("/t", 1)[0]},
            profile=Profile.from_samples(
                rewards,
                strict_rewards=[0.0] * len(rewards),
                categories=["equivalent" if r else "wrong" for r in rewards],
            ),
        )

    pivots = [
        pivot("a/t0", [1, 0, 0, 0], "ls -la"),
        pivot("a/t1", [1, 1, 1, 1], "cat x"),
        pivot("b/t0", [1, 1, 0, 0], "ls  -la"),
        pivot("b/t1", [0, 0, 0, 0], "make"),
        pivot("c/t0", [1, 1, 1, 0], "make test"),
    ]
    path = tmp_path / "profiled.jsonl"
    write_pivots(pivots, path)
    return path


def test_stats_shows_profile_diagnostics_and_writes_plots(tmp_path: Path, capsys) -> None:
    assert main(["stats", str(_profiled(tmp_path)), "--plot", str(tmp_path / "figs"), "--bins", "4"]) == 0
    out = capsys.readouterr().out
    assert "zero-variance candidates" in out and "40.0%" in out  # a/t1 and b/t1 of 5
    assert "100.0% (10/10)" in out  # every functional success missed by the (all-zero) strict reward
    assert "domain terminal" in out and "category equivalent" in out
    figures = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert figures == ["action_kinds.png", "categories.png", "prefix_lengths.png", "reward_means.png"]
    assert all((tmp_path / "figs" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in figures)


def test_filter_keeps_d_adv_and_dedups(tmp_path: Path, capsys) -> None:
    profiled, out = _profiled(tmp_path), tmp_path / "pivots.jsonl"
    assert main(["filter", str(profiled), "--mode", "adv", "--lambda-diff", "0.6", "--out", str(out)]) == 0
    assert [p.id for p in read_pivots(out)] == ["a/t0", "b/t0"]
    assert "dropped: zero variance 2, mean >= lambda_diff=0.6 1" in capsys.readouterr().out
    assert main(["filter", str(profiled), "--lambda-diff", "0.6", "--dedup", "--out", str(out)]) == 0
    assert [p.id for p in read_pivots(out)] == ["a/t0"]  # "ls  -la" is "ls -la"
    assert main(["filter", str(profiled), "--mode", "cand", "--out", str(out)]) == 0
    assert len(read_pivots(out)) == 5


def test_filter_adv_on_unprofiled_candidates_fails_naming_the_pivot(
    shared_data: Path, tmp_path: Path, capsys
) -> None:
    code = main(
        ["filter", str(shared_data / "nemo_gym" / "swe_pivots.jsonl"), "--out", str(tmp_path / "x.jsonl")]
    )
    assert code == 1 and "pivot example_1 has no profile" in capsys.readouterr().err


def test_export_writes_nemo_gym_rows_that_read_back_to_the_same_pivots(tmp_path: Path) -> None:
    profiled, rows = _profiled(tmp_path), tmp_path / "rows.jsonl"
    assert main(["export", str(profiled), "--format", "nemo-gym", "--out", str(rows)]) == 0
    written = _lines(rows)
    assert [r["uuid"] for r in written] == ["a/t0", "a/t1", "b/t0", "b/t1", "c/t0"]
    assert written[0]["expected_action"] == {
        "type": "function_call",
        "name": "bash",
        "arguments": '{"command": "ls -la"}',
    }
    assert [p.to_dict() for p in read_as_pivots(rows)] == [p.to_dict() for p in read_pivots(profiled)]


def test_split_partitions_by_trajectory(tmp_path: Path, capsys) -> None:
    candidates = _profiled(tmp_path)
    train, heldout = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    args = [
        "split",
        str(candidates),
        "--heldout",
        "0.5",
        "--seed",
        "3",
        "--train-out",
        str(train),
        "--heldout-out",
        str(heldout),
    ]
    assert main(args) == 0
    a, b = read_pivots(train), read_pivots(heldout)
    assert len(a) + len(b) == len(read_pivots(candidates))
    # The seeded hash is part of the contract: the same seed splits the same way on every machine.
    assert {p.trajectory_id for p in a} == {"a", "b"} and {p.trajectory_id for p in b} == {"c"}
    assert "heldout: 1 pivots from 1 trajectories" in capsys.readouterr().out


def test_pivotrl_console_script_runs_extract(shared_data: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "pivotrl"
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    out = tmp_path / "p.jsonl"
    result = subprocess.run(
        [
            str(script),
            "extract",
            str(shared_data / "nemo_gym" / "swe_pivots.jsonl"),
            "--domain",
            "swe",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "pivots written: 5" in result.stdout
    assert [p["id"] for p in _lines(out)] == [f"example_{i}" for i in range(1, 6)]
