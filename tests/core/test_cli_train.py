"""`pivotrl train` reports its progress: a log line per step (and a bar on a terminal); -q silences both."""

from __future__ import annotations

from pathlib import Path

import pytest

from pivot_envs.cli import main
from pivot_envs.pivot import write_pivots


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer model of SmolLM2's architecture, with SmolLM2's tokenizer."""
    pytest.importorskip("transformers")
    from tiny_model import tiny_checkpoint as save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-model"))


def _train(tiny_checkpoint: Path, tmp_path: Path, *flags: str) -> int:
    """`pivotrl [FLAGS] train ...` on two bundled pivots; flags from `--env-kwargs` on go after `train`."""
    from pivot_envs.domains.tool_use.env import bundled_pivots

    tmp_path.mkdir(parents=True, exist_ok=True)
    write_pivots(bundled_pivots()[:2], tmp_path / "train.jsonl")
    after = list(flags[flags.index("--env-kwargs") :]) if "--env-kwargs" in flags else []
    flags = flags[: len(flags) - len(after)]
    return main(
        [
            *flags,
            "train",
            *after,
            "--pivots",
            str(tmp_path / "train.jsonl"),
            "--policy",
            f"hf:{tiny_checkpoint}",
            "--steps",
            "2",
            "--batch-pivots",
            "1",
            "--group-size",
            "2",
            "--max-new-tokens",
            "4",
            "--checkpoint-every",
            "0",
            "--num-envs",
            "1",
            "--out",
            str(tmp_path / "run"),
        ]
    )


def test_train_logs_a_line_per_step_with_its_reward_and_loss(
    tiny_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    assert _train(tiny_checkpoint, tmp_path) == 0
    captured = capsys.readouterr()
    steps = [line for line in captured.err.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step 1/2", "step 2/2"]
    assert all("reward mean" in line and "loss" in line and "tokens/s" in line for line in steps)
    assert "trained 2 steps" in captured.out  # the result stays on stdout


def test_quiet_train_prints_no_step_lines(tiny_checkpoint: Path, tmp_path: Path, capsys) -> None:
    assert _train(tiny_checkpoint, tmp_path, "-q") == 0
    captured = capsys.readouterr()
    assert "step 1/2" not in captured.err and "GRPO" not in captured.err
    assert "trained 2 steps" in captured.out


def test_train_into_an_output_holding_an_earlier_run_is_one_error_line_and_changes_nothing(
    tiny_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"step": 1}\n')
    assert _train(tiny_checkpoint, tmp_path, "-q") == 1
    # One line, no traceback: the output is the user's to change (besides transformers' loading bar).
    err = [line for line in capsys.readouterr().err.splitlines() if line and "Loading weights" not in line]
    assert len(err) == 1 and err[0].startswith(
        f"pivotrl train: error: {metrics.parent} holds an earlier run (1 step in metrics.jsonl)"
    ), err
    assert sorted(path.name for path in metrics.parent.iterdir()) == ["metrics.jsonl"]


@pytest.mark.parametrize(
    ("env_kwargs", "message"),
    [
        ("[1]", "--env-kwargs must be a JSON object, got list"),
        ("{urls: 1}", "--env-kwargs must be a JSON object: Expecting property name"),
        (
            '{"env_id": "pivot/tool-use-v0"}',
            "--env-kwargs: 'env_id' is train()'s own argument; name the env with --env",
        ),
    ],
)
def test_bad_env_kwargs_stop_train_before_anything_loads(
    env_kwargs: str, message: str, tmp_path: Path, capsys
) -> None:
    assert main(["train", "--pivots", str(tmp_path / "absent.jsonl"), "--env-kwargs", env_kwargs]) == 2
    assert message in capsys.readouterr().err


def test_env_kwargs_reach_the_env_that_scores_the_actions(tiny_checkpoint: Path, tmp_path: Path) -> None:
    # The strict verifier named through --env-kwargs trains; a keyword the env does not take reaches
    # gym.make and stops the run naming it.
    assert _train(tiny_checkpoint, tmp_path, "--env-kwargs", '{"verifier": "strict"}') == 0
    with pytest.raises(TypeError, match="no_such_option"):
        _train(tiny_checkpoint, tmp_path / "second", "--env-kwargs", '{"no_such_option": 1}')
