"""Settings have one source: config dataclasses validate themselves, `--config FILE` sets their
defaults, flags override the file, and `--print-config` writes what a command runs with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pivot_envs.cli import main
from pivot_envs.config import ConfigError, UnknownOptionError
from pivot_envs.evaluate import EvalConfig
from pivot_envs.extract import FilterConfig, SplitConfig
from pivot_envs.profile import ProfileConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def printed_config(capsys, *argv: str) -> dict:
    """The settings `pivotrl ARGV --print-config` prints, read back as TOML."""
    assert main([*argv, "--print-config"]) == 0
    return tomllib.loads(capsys.readouterr().out)


def error_of(capsys, argv: list[str], status: int = 2) -> str:
    assert main(argv) == status
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]


def _grpo(**values):
    from pivot_envs.adapters.grpo import GRPOConfig

    return GRPOConfig(**values)


# -- validation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FilterConfig(lambda_diff=1.5), "FilterConfig.lambda_diff = 1.5: must be in [0, 1]"),
        (lambda: SplitConfig(heldout=-0.1), "SplitConfig.heldout = -0.1: must be in [0, 1]"),
        (lambda: ProfileConfig(k=0), "ProfileConfig.k = 0: must be >= 1"),
        (lambda: ProfileConfig(top_p=0.0), "ProfileConfig.top_p = 0.0: must be in (0, 1]"),
        (lambda: EvalConfig(batch_size=0), "EvalConfig.batch_size = 0: must be >= 1"),
        (
            lambda: EvalConfig(greedy=False, samples=0),
            "EvalConfig: nothing to evaluate: greedy is off and samples is 0",
        ),
        (lambda: _grpo(group_size=1), "GRPOConfig.group_size = 1: must be >= 2"),
        (lambda: _grpo(learning_rate=0.0), "GRPOConfig.learning_rate = 0.0: must be in (0, 1]"),
        (lambda: _grpo(beta=-0.1), "GRPOConfig.beta = -0.1: must be >= 0"),
    ],
)
def test_a_setting_out_of_range_names_the_field_and_the_allowed_range(make, message) -> None:
    with pytest.raises(ConfigError) as caught:
        make()
    assert str(caught.value).startswith(message)


def test_an_unknown_choice_is_refused_with_a_did_you_mean() -> None:
    with pytest.raises(UnknownOptionError, match=r"unknown FilterConfig.mode 'cnd'; did you mean 'cand'\?"):
        FilterConfig(mode="cnd")


def test_a_flag_out_of_range_is_one_line_and_a_usage_error(tmp_path: Path, capsys) -> None:
    argv = ["filter", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "o.jsonl"), "--lambda-diff", "1.5"]
    assert (
        error_of(capsys, argv) == "pivotrl filter: error: FilterConfig.lambda_diff = 1.5: must be in [0, 1]"
    )


def test_a_flag_with_an_unknown_choice_gets_a_did_you_mean(tmp_path: Path, capsys) -> None:
    argv = ["filter", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "o.jsonl"), "--mode", "cnd"]
    assert error_of(capsys, argv).endswith(
        "invalid choice: 'cnd'; did you mean 'cand'? (choose from adv, adv-or-unsolved, cand)"
    )


# -- --config and --print-config ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("f.toml", "lambda_diff = 0.3\ndedup = true\n"),
        ("f.yaml", "lambda-diff: 0.3\ndedup: true\n"),
        ("f.json", '{"filter": {"lambda_diff": 0.3, "dedup": true}}'),
    ],
)
def test_a_config_file_sets_the_defaults_and_flags_override_it(
    tmp_path: Path, capsys, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    base = ["filter", "p.jsonl", "--out", "o.jsonl", "--config", str(path)]
    settings = printed_config(capsys, *base)
    assert (settings["lambda_diff"], settings["dedup"], settings["mode"]) == (0.3, True, "adv")
    assert printed_config(capsys, *base, "--lambda-diff", "0.5")["lambda_diff"] == 0.5


def test_a_file_may_hold_the_required_options_of_a_command(tmp_path: Path, capsys) -> None:
    path = tmp_path / "train.toml"
    path.write_text('pivots = "train.jsonl"\n[train]\nbeta = 0.04\nlora = true\n')
    settings = printed_config(capsys, "train", "--config", str(path))
    assert settings["pivots"] == "train.jsonl" and settings["beta"] == 0.04 and settings["lora"] is True


def test_an_unknown_key_in_a_config_file_gets_a_did_you_mean(tmp_path: Path, capsys) -> None:
    path = tmp_path / "f.toml"
    path.write_text("lambda_dif = 0.3\n")
    line = error_of(capsys, ["filter", "p.jsonl", "--out", "o.jsonl", "--config", str(path)])
    assert line.startswith(
        f"pivotrl filter: error: unknown setting in {path} 'lambda_dif'; did you mean 'lambda_diff'?"
    )


def test_a_value_of_the_wrong_type_in_a_config_file_names_the_key_and_the_type(
    tmp_path: Path, capsys
) -> None:
    path = tmp_path / "f.toml"
    path.write_text('[profile]\nk = "four"\n')
    line = error_of(capsys, ["run", "--config", str(path)])
    assert line == f"pivotrl run: error: {path} [profile]: k = 'four': must be int"


def test_a_config_file_of_an_unknown_format_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "f.ini"
    path.write_text("[filter]\n")
    line = error_of(capsys, ["filter", "p.jsonl", "--out", "o.jsonl", "--config", str(path)])
    assert (
        line
        == f"pivotrl filter: error: unknown config file format of {path} '.ini' (choose from .json, .toml, .yaml, .yml)"
    )


def run_config(*argv: str):
    """The RunConfig `pivotrl run ARGV` parses, before its stages are composed."""
    from pivot_envs.cli import build_parser

    return build_parser("run").parse_args(["run", *argv]).run


def test_run_composes_the_stage_configs_with_its_presets(capsys) -> None:
    settings = printed_config(capsys, "run", "--train.beta", "0.04", "--train.lora", "--profile.k", "2")
    train, profile = settings["train"], settings["profile"]
    assert (train["beta"], train["lora"], profile["k"]) == (0.04, True, 2)
    # the presets of the nine-minute CPU run, each declared once in RunConfig
    assert (train["learning_rate"], train["steps"], settings["filter"]["lambda_diff"]) == (2e-5, 3, 0.9)
    composed = run_config().composed()
    assert composed.train.out == str(Path("runs/pivotrl") / "train") and composed.train.policy == "hf:smollm2"


def test_run_seed_and_max_new_tokens_reach_every_stage_that_is_not_given_its_own(capsys) -> None:
    composed = run_config("--seed", "7", "--max-new-tokens", "16").composed()
    for stage in (composed.profile, composed.train, composed.eval):
        assert (stage.seed, stage.max_new_tokens) == (7, 16)
    assert composed.split.seed == 7
    # --print-config shows each copy that follows the run as a comment naming where its value comes from.
    assert main(["run", "--seed", "7", "--max-new-tokens", "16", "--print-config"]) == 0
    train = capsys.readouterr().out.split("[train]\n")[1].split("\n[")[0].splitlines()
    assert "# seed = 7  (unset: the run's seed)" in train
    assert "# max_new_tokens = 16  (unset: the run's max_new_tokens)" in train
    assert '# out = "runs/pivotrl/train"  (unset: the run\'s out, /train)' in train


def test_a_stage_setting_given_on_the_command_line_wins_over_the_runs(capsys) -> None:
    argv = ("--seed", "3", "--train.seed", "7", "--max-new-tokens", "16", "--eval.max-new-tokens", "32")
    composed = run_config(*argv).composed()
    assert (composed.train.seed, composed.profile.seed, composed.split.seed) == (7, 3, 3)
    assert (composed.eval.max_new_tokens, composed.train.max_new_tokens) == (32, 16)
    settings = printed_config(capsys, "run", *argv)
    assert (settings["train"]["seed"], settings["eval"]["max_new_tokens"]) == (7, 32)
    assert "seed" not in settings["profile"]  # unset: a comment, following --seed


def test_a_stage_setting_in_a_config_file_wins_over_the_runs_flag(tmp_path: Path, capsys) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[train]\nseed = 5\n")
    settings = printed_config(capsys, "run", "--config", str(path), "--seed", "3")
    assert (settings["seed"], settings["train"]["seed"]) == (3, 5)
    # Given as the stage preset's value, it is still the user's: the run's seed does not replace it.
    assert run_config("--seed", "3", "--train.seed", "0").composed().train.seed == 0


def test_the_old_run_flags_are_refused(capsys) -> None:
    assert main(["run", "--k", "3", "--print-config"]) == 2
    assert capsys.readouterr().err.strip().endswith("unrecognized arguments: --k 3")


def test_print_config_output_read_back_gives_the_same_settings(tmp_path: Path, capsys) -> None:
    assert main(["run", "--train.beta", "0.1", "--candidates", "4", "--print-config"]) == 0
    first = capsys.readouterr().out
    path = tmp_path / "run.toml"
    path.write_text(first)
    assert main(["run", "--config", str(path), "--print-config"]) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize(
    ("name", "text", "detail"),
    [("f.toml", "a = \n", "Invalid value (at line 1, column 5)"), ("f.yaml", "a: [1,\n", "line 2, column 1")],
)
def test_a_config_file_that_does_not_parse_is_one_line_naming_it(
    tmp_path: Path, capsys, name, text, detail
) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert main(["filter", "p.jsonl", "--out", "o.jsonl", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and err.startswith(f"pivotrl filter: error: --config {path}: ") and detail in err
    )


def test_every_progress_bar_is_off_under_quiet_and_a_short_jobs_bar_only_on_a_terminal(capsys) -> None:
    """`progress_bar` is how the library makes its bars (profiling, SFT, GRPO, evaluation, reading,
    writing): `pivotrl -q` sets the `pivot_envs` logger to WARNING and silences every one."""
    import logging

    from pivot_envs.config import progress_bar

    def drawn(**kwargs) -> str:
        for _ in progress_bar(range(3), desc="counting", unit="n", **kwargs):
            pass
        return capsys.readouterr().err

    assert "counting: 100%" in drawn() and "3/3" in drawn()  # a long job's bar shows in a log too
    assert drawn(terminal_only=True) == drawn(enabled=False) == ""  # stderr is no terminal here
    logger = logging.getLogger("pivot_envs")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        assert drawn() == ""
        with progress_bar(total=2, desc="quiet", unit="n") as bar:
            bar.update(2)  # a silenced bar still takes the calls
        assert capsys.readouterr().err == ""
    finally:
        logger.setLevel(level)
