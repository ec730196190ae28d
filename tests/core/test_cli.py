"""The `pivotrl` command line as a tool: help and version, -v/-q, one-line errors, inputs checked
before work starts, and a run report without matplotlib."""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from pivot_envs.cli import build_parser, logging_to_stderr, main
from pivot_envs.config import add_config, command_parser, option
from pivot_envs.pivot import Pivot, Profile, write_pivots

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "pivotrl"
NO_MODEL = "hf:/no/such/checkpoint"  # loading it would fail with another error: the checks come first


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and nested subcommand of a parser (`sandbox gc`, ...)."""
    paths = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += [(*prefix, name), *command_paths(sub, (*prefix, name))]
    return paths


def candidates(tmp_path: Path, count: int = 2, domain: str | None = None) -> Path:
    """A few bundled tau-bench airline candidates (tool-use domain) in a pivot file."""
    from pivot_envs.domains.tool_use.env import bundled_pivots

    pivots = list(bundled_pivots()[:count])
    if domain is not None:
        pivots = [Pivot.from_dict({**p.to_dict(), "domain": domain}) for p in pivots]
    path = tmp_path / f"candidates-{domain or 'bundled'}.jsonl"
    write_pivots(pivots, path)
    return path


def error_line(capsys) -> str:
    """The whole of stderr, checked to be exactly one line."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err.strip()


# -- help and version ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", command_paths(build_parser()), ids=" ".join)
def test_every_command_has_a_help_that_exits_zero(path: tuple[str, ...], capsys) -> None:
    assert main([*path, "--help"]) == 0
    assert f"usage: pivotrl {' '.join(path)}" in capsys.readouterr().out


@pytest.mark.parametrize("path", command_paths(build_parser()), ids=" ".join)
def test_no_help_shows_a_none_value_or_says_its_default_twice(path: tuple[str, ...], capsys) -> None:
    assert main([*path, "--help"]) == 0
    helped = capsys.readouterr().out
    assert not re.search(r"--[\w.-]+ None\b", helped), helped  # `--out None` named no value
    assert "(default: None)" not in helped and "(default: False)" not in helped, helped
    for paragraph in helped.split("\n  -"):
        assert paragraph.count("default") <= 1 or "(default:" not in paragraph.split("default", 1)[1], (
            paragraph
        )


def test_the_commands_walked_include_every_data_and_method_command() -> None:
    names = {path[0] for path in command_paths(build_parser())}
    assert {"extract", "profile", "filter", "split", "stats", "export", "eval", "train", "run"} <= names


def test_help_lists_every_command_and_a_bare_pivotrl_prints_it(capsys) -> None:
    assert main(["--help"]) == 0
    helped = capsys.readouterr().out
    assert "95% CI" in helped  # eval's help: a literal % once crashed the whole listing
    assert main([]) == 0
    assert capsys.readouterr().out == helped


def test_version_is_the_installed_distributions(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pivotrl {metadata.version('pivot-envs')}"


def test_a_percent_sign_in_a_config_help_or_default_is_shown_as_is(capsys) -> None:
    @dataclass
    class Shares:
        fraction: float = option(0.5, "share of the pivots, as in 50% of them")
        pattern: str = option("%s-%d", "a printf pattern")

    parser = command_parser(prog="x")
    add_config(parser, Shares, "shares")
    parser.print_help()
    text = capsys.readouterr().out
    assert "as in 50% of them" in text and "%s-%d" in text


def test_every_command_says_what_policy_device_dtype_and_prompt_budget_are_in_one_help_text() -> None:
    from pivot_envs.cli.options import policy_help

    parser = build_parser("")
    seen: dict[str, list[str]] = {}
    for name in ("eval", "profile", "train", "reproduce", "run"):
        command = parser.commands[name]
        command.print_help(io.StringIO())  # builds the flags of its configs
        for flag in ("--policy", "--device", "--dtype", "--max-prompt-tokens"):
            action = command._option_string_actions.get(flag)
            if action is not None:
                assert action.help.startswith(policy_help(flag[2:].replace("-", "_"))), (name, flag)
                seen.setdefault(flag, []).append(name)
    assert seen == {
        "--policy": ["eval", "profile", "train", "reproduce", "run"],
        "--device": ["eval", "profile", "train", "reproduce", "run"],
        # reproduce has none: a scale fixes its precision, and its stage digests stay as they were
        "--dtype": ["eval", "profile", "train", "run"],
        "--max-prompt-tokens": ["eval", "train", "run"],
    }
    # Each command keeps its own default: required, a value, or the scale's.
    assert parser.commands["eval"]._option_string_actions["--policy"].required
    assert parser.commands["run"]._option_string_actions["--device"].default == "cpu"
    assert (
        parser.commands["reproduce"]
        ._option_string_actions["--device"]
        .help.endswith("(default: the scale's)")
    )


def test_eval_with_dtype_bfloat16_loads_the_hf_checkpoint_in_bfloat16_and_evaluates(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import torch
    from tiny_model import tiny_checkpoint

    from pivot_envs.cli import _checks

    loaded = []
    load = _checks.load_named_policy

    def keep(spec: str, **options: object) -> object:  # the real loader; the policy kept to look at
        loaded.append(load(spec, **options))
        return loaded[-1]

    monkeypatch.setattr(_checks, "load_named_policy", keep)
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    argv = ["eval", "--pivots", str(candidates(tmp_path, count=1)), "--policy", f"hf:{checkpoint}"]
    argv += ["--dtype", "bfloat16", "--max-prompt-tokens", "256", "--max-new-tokens", "4"]
    assert main(argv) == 0
    assert "turn accuracy" in capsys.readouterr().out.lower()
    assert {parameter.dtype for parameter in loaded[0].model.parameters()} == {torch.bfloat16}


def test_profiles_made_in_bfloat16_are_not_resumed_in_float32(tmp_path: Path, capsys) -> None:
    from tiny_model import tiny_checkpoint

    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    pivots, out = str(candidates(tmp_path, count=1)), str(tmp_path / "profiled.jsonl")
    argv = [
        "profile",
        pivots,
        "--policy",
        f"hf:{checkpoint}",
        "--out",
        out,
        "--k",
        "2",
        "--max-new-tokens",
        "2",
    ]
    assert main([*argv, "--dtype", "bfloat16"]) == 0
    assert '"dtype": "bfloat16"' in Path(out).read_text()  # the reference recorded with its precision
    capsys.readouterr()
    assert main(argv) != 0  # the same weights in float32 are another reference: no mixed file
    assert "settings" in error_line(capsys)


def test_a_running_vllm_server_refuses_a_dtype_it_cannot_apply() -> None:
    from pivot_envs.policy import PolicySpecError, load_policy

    with pytest.raises(PolicySpecError, match="--dtype"):
        load_policy("vllm-server:http://127.0.0.1:9#m", dtype="bfloat16")


def test_a_dtype_that_is_not_a_precision_is_refused_naming_it_before_any_model_loads(
    tmp_path: Path, capsys
) -> None:
    from pivot_envs.adapters.cli_run import RunConfig
    from pivot_envs.config import ConfigError

    pivots = str(candidates(tmp_path))
    assert main(["eval", "--pivots", pivots, "--policy", NO_MODEL, "--dtype", "bf16"]) == 2
    assert "--dtype bf16: must be one of float32, bfloat16, float16" in error_line(capsys)
    out = str(tmp_path / "profiled.jsonl")
    assert main(["profile", pivots, "--policy", NO_MODEL, "--out", out, "--dtype", "half"]) == 2
    assert "--dtype half" in error_line(capsys)
    with pytest.raises(ConfigError, match="--dtype fp8"):
        RunConfig(dtype="fp8")


@pytest.mark.skipif(not SCRIPT.exists(), reason=f"console script not installed next to {sys.executable}")
def test_the_console_script_prints_help_version_and_each_commands_help() -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)

    for args in (["--help"], [], ["eval", "--help"]):
        result = run(*args)
        assert result.returncode == 0 and result.stderr == "", (args, result.stderr)
        assert "usage: pivotrl" in result.stdout
    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"pivotrl {metadata.version('pivot-envs')}"


# -- logging: -v and -q ----------------------------------------------------------------------------


def test_log_lines_follow_the_verbosity(capsys) -> None:
    logger = logging.getLogger("pivot_envs.test")
    for verbosity in (-2, -1, 0, 1):
        with logging_to_stderr(verbosity):
            logger.debug("a detail")
            logger.info("a step")
            logger.warning("a skipped record")
            logger.error("a failure")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "pivotrl: error: a failure",  # -qq
        "pivotrl: warning: a skipped record",
        "pivotrl: error: a failure",  # -q
        "a step",
        "pivotrl: warning: a skipped record",
        "pivotrl: error: a failure",  # default
        "debug: pivot_envs.test: a detail",
        "a step",
        "pivotrl: warning: a skipped record",
        "pivotrl: error: a failure",
    ]
    assert logging.getLogger("pivot_envs").handlers == []  # main leaves the logger as it found it


@pytest.mark.parametrize(
    ("before", "after", "warned"),
    [
        ([], [], True),
        (["-q"], [], True),
        ([], ["-q"], True),
        (["-q", "-q"], [], False),
        (["-q"], ["-q"], False),
    ],
)
def test_quiet_flags_count_on_both_sides_of_the_command(
    tmp_path: Path, capsys, before, after, warned
) -> None:
    broken = tmp_path / "chats.jsonl"
    good = {
        "id": "chat-1",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    }
    broken.write_text(json.dumps(good) + "\n{not json\n")
    assert main([*before, "extract", str(broken), "--out", str(tmp_path / "out.jsonl"), *after]) == 0
    captured = capsys.readouterr()
    assert (f"pivotrl: warning: {broken}:2: invalid JSON" in captured.err) is warned
    assert "pivots written: 1" in captured.out  # results go to stdout whatever the verbosity


# -- errors ----------------------------------------------------------------------------------------


def test_a_user_error_is_one_line_naming_the_input_and_exits_non_zero(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["extract", str(empty), "--out", str(tmp_path / "out.jsonl")]) == 1
    assert error_line(capsys) == f"pivotrl extract: error: {empty}: the input is empty (no records)"
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("flags", [["-v", "extract"], ["extract", "-v"]], ids=["before", "after"])
def test_verbose_shows_the_traceback_of_a_user_error(tmp_path: Path, capsys, flags) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert main([*flags, str(empty), "--out", str(tmp_path / "out.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "PivotFormatError" in err
    assert err.strip().splitlines()[-1] == f"pivotrl extract: error: {empty}: the input is empty (no records)"


@pytest.mark.parametrize(
    "error",
    [
        ZeroDivisionError("division by zero"),
        ValueError("a bug's message"),
        KeyError("key"),
        OSError("deep inside"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_exception_that_is_no_user_error_is_a_bug_and_keeps_its_traceback(monkeypatch, error) -> None:
    import pivot_envs.cli.domains

    def broken(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(pivot_envs.cli.domains, "main", broken)
    with pytest.raises(type(error)):
        main(["domains"])


def test_a_missing_input_file_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nowhere.jsonl"
    assert main(["stats", str(missing)]) == 1
    assert error_line(capsys) == f"pivotrl stats: error: {missing}: No such file or directory"


def test_an_unknown_command_gets_a_did_you_mean(capsys) -> None:
    assert main(["filtr"]) == 2
    assert "invalid choice: 'filtr'; did you mean 'filter'?" in capsys.readouterr().err


# -- commands are plugins ----------------------------------------------------------------------------


def _command_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, body: str) -> None:
    """An installed distribution (a dist-info on sys.path) declaring the command `hello` in `module`."""
    (tmp_path / f"{module}.py").write_text(body)
    info = tmp_path / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[pivot_envs.commands]\nhello = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_command_comes_from_the_entry_point_group_with_config_and_print_config(
    tmp_path, monkeypatch, capsys
) -> None:
    _command_plugin(
        tmp_path,
        monkeypatch,
        "greeting_command",
        (
            "from dataclasses import dataclass\n"
            "from pivot_envs.config import add_config, at_least, option\n"
            "HELP = 'greet someone'\n"
            "@dataclass\n"
            "class Greeting:\n"
            "    times: int = option(1, 'how many greetings')\n"
            "    def __post_init__(self):\n"
            "        at_least(self, 1, 'times')\n"
            "def add_arguments(parser):\n"
            "    parser.add_argument('--name', required=True)\n"
            "    add_config(parser, Greeting, 'greeting')\n"
            "def main(args):\n"
            "    print(' '.join(['hello', args.name] * args.greeting.times))\n"
            "    return 0\n"
        ),
    )
    assert main(["--help"]) == 0
    assert "greet someone" in capsys.readouterr().out
    assert main(["hello", "--name", "ada", "--times", "2"]) == 0
    assert capsys.readouterr().out == "hello ada hello ada\n"
    assert main(["hello", "--name", "ada", "--print-config"]) == 0
    assert capsys.readouterr().out == 'name = "ada"\ntimes = 1\n'
    assert main(["hello", "--name", "ada", "--times", "0"]) == 2
    assert error_line(capsys) == "pivotrl hello: error: Greeting.times = 0: must be >= 1"


def test_a_broken_command_plugin_is_a_warning_naming_it_and_the_others_work(
    tmp_path, monkeypatch, capsys
) -> None:
    _command_plugin(tmp_path, monkeypatch, "broken_command", "raise ImportError('no such thing')\n")
    assert main(["--help"]) == 0
    captured = capsys.readouterr()
    assert (
        "pivotrl: warning: command 'hello' (broken_command) failed to load: ImportError('no such thing')"
        in captured.err
    )
    assert "    extract " in captured.out and "    train " in captured.out


def test_the_bundled_commands_of_adapters_and_domains_are_the_plugins_they_declare() -> None:
    from pivot_envs.cli import command_entry_points

    values = {name: entry_point.value for name, entry_point in command_entry_points().items()}
    assert (
        values["train"] == "pivot_envs.adapters.cli_train" and values["run"] == "pivot_envs.adapters.cli_run"
    )
    assert values["sandbox"] == "pivot_envs.domains.terminal.cli"


def test_a_core_command_loads_no_adapter_or_domain() -> None:
    code = (
        "import sys\n"
        "from pivot_envs.cli import main\n"
        "assert main(['filter', '--help']) == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pivot_envs.adapters.', 'pivot_envs.domains.'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# -- inputs are checked before any model loads -----------------------------------------------------


def _names(tmp: Path) -> list[tuple[list[str], str]]:
    pivots, out = str(candidates(tmp)), str(tmp / "out")
    return [
        (
            ["profile", pivots, "--policy", NO_MODEL, "--out", out, "--env", "pivot/tool-use-v1"],
            "pivotrl profile: error: unknown env id 'pivot/tool-use-v1'; did you mean 'pivot/tool-use-v0'?",
        ),
        (
            [
                "profile",
                pivots,
                "--policy",
                NO_MODEL,
                "--out",
                out,
                "--env-kwargs",
                '{"verifier": "functionl"}',
            ],
            "pivotrl profile: error: unknown pivot/tool-use-v0 verifier 'functionl'; did you mean 'functional'?",
        ),
        (
            ["eval", "--pivots", pivots, "--policy", NO_MODEL, "--verifier", "strickt"],
            "pivotrl eval: error: unknown pivot/tool-use-v0 verifier 'strickt'; did you mean 'strict'?",
        ),
        (
            ["eval", "--pivots", str(candidates(tmp, domain="tool_use")), "--policy", NO_MODEL],
            "pivotrl eval: error: unknown domain 'tool_use'; did you mean 'tool-use'?",
        ),
        (
            ["train", "--pivots", pivots, "--policy", NO_MODEL, "--out", out, "--env", "pivot/tool_use-v0"],
            "pivotrl train: error: unknown env id 'pivot/tool_use-v0'; did you mean 'pivot/tool-use-v0'?",
        ),
        (
            ["train", "--pivots", pivots, "--policy", NO_MODEL, "--out", out, "--verifier", "exact"],
            "pivotrl train: error: unknown pivot/tool-use-v0 verifier 'exact' (choose from functional, strict)",
        ),
        (
            ["run", "--domain", "tooluse", "--out", out],
            "pivotrl run: error: unknown domain 'tooluse'; did you mean 'tool-use'?",
        ),
    ]


@pytest.mark.parametrize("case", range(7))
def test_an_unknown_env_domain_or_verifier_is_refused_before_the_policy_loads(
    tmp_path: Path, capsys, case
) -> None:
    argv, expected = _names(tmp_path)[case]
    assert main(argv) == 1
    assert error_line(capsys).startswith(expected)
    assert not (tmp_path / "out").exists()  # nothing sampled, nothing written


@pytest.mark.parametrize(
    "command", ["extract", "profile", "filter", "split", "stats", "export", "eval", "train"]
)
def test_an_empty_input_is_an_error_naming_the_input_not_the_output(tmp_path: Path, capsys, command) -> None:
    empty, out = str(tmp_path / "empty.jsonl"), str(tmp_path / "out")
    Path(empty).write_text("")
    argv = {
        "extract": [empty, "--out", out],
        "profile": [empty, "--policy", NO_MODEL, "--out", out],
        "filter": [empty, "--out", out],
        "split": [empty, "--train-out", out, "--heldout-out", str(tmp_path / "heldout")],
        "stats": [empty],
        "export": [empty, "--out", out],
        "eval": ["--pivots", empty, "--policy", NO_MODEL],
        "train": ["--pivots", empty, "--policy", NO_MODEL, "--out", out],
    }[command]
    assert main([command, *argv]) == 1
    assert error_line(capsys) == f"pivotrl {command}: error: {empty}: the input is empty (no records)"
    assert not Path(out).exists()


@pytest.mark.parametrize("command", ["profile", "extract"])
def test_a_binary_input_is_an_error_naming_the_file_line_and_byte(tmp_path: Path, capsys, command) -> None:
    binary, out = tmp_path / "image.png", tmp_path / "profiled.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    policy = ["--policy", NO_MODEL] if command == "profile" else []
    assert main(["-q", command, str(binary), *policy, "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        f"pivotrl {command}: error: {binary}: no pivot could be read (3 of 3 records malformed"
    )
    assert err[-1].endswith(f"first: {binary}:1: invalid JSON: not UTF-8 at byte 0)")
    assert err[:3] == [  # each malformed record, with its line
        f"pivotrl: warning: {binary}:1: invalid JSON: not UTF-8 at byte 0",
        f"pivotrl: warning: {binary}:2: invalid JSON: Expecting value at column 1",
        f"pivotrl: warning: {binary}:3: invalid JSON: Expecting value at column 1",
    ]
    assert not out.exists()


def test_extract_warns_of_an_empty_input_among_others_and_goes_on(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "out.jsonl"
    assert main(["extract", str(empty), str(candidates(tmp_path)), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"pivotrl: warning: {empty}: the input is empty (no records)" in captured.err
    assert "pivots written: 2" in captured.out


def _outputs(tmp: Path, blocker: Path) -> list[tuple[list[str], str]]:
    pivots, profiled, inside = str(candidates(tmp)), str(_profiled(tmp)), str(blocker / "x")
    return [
        (["extract", pivots, "--out", inside], "--out"),
        (["filter", profiled, "--mode", "cand", "--out", inside], "--out"),
        (["export", profiled, "--out", inside], "--out"),
        (["split", profiled, "--train-out", str(tmp / "a.jsonl"), "--heldout-out", inside], "--heldout-out"),
        (["stats", profiled, "--plot", inside], "--plot"),
        (["profile", pivots, "--policy", NO_MODEL, "--out", inside], "--out"),
        (["eval", "--pivots", pivots, "--policy", NO_MODEL, "--json", inside], "--json"),
        (["train", "--pivots", pivots, "--policy", NO_MODEL, "--out", inside], "--out"),
        (["run", "--out", inside], "--out"),
    ]


def _profiled(tmp: Path) -> Path:
    path = tmp / "profiled.jsonl"
    pivot = Pivot(
        "a/t0",
        "tool-use",
        [{"role": "user", "content": "hi"}],
        {"role": "assistant", "content": "hello"},
        profile=Profile.from_samples([1.0, 0.0]),
    )
    write_pivots([pivot], path)
    return path


@pytest.mark.parametrize("case", range(9))
def test_an_output_under_a_regular_file_is_refused_naming_the_path(tmp_path: Path, capsys, case) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a directory\n")
    argv, flag = _outputs(tmp_path, blocker)[case]
    assert main(argv) == 1
    assert error_line(capsys) == (
        f"pivotrl {argv[0]}: error: {flag} {blocker / 'x'}: {blocker} is a regular file, not a directory"
    )
    assert blocker.read_text() == "a file, not a directory\n"


# -- plotting is optional --------------------------------------------------------------------------


def _report_inputs(out: Path) -> dict:
    """Small real inputs of `write_report`: two profiled candidates, one pivot, two logged steps."""
    from pivot_envs.adapters.cli_run import RunConfig, Signal, WarmUp
    from pivot_envs.adapters.grpo import PivotRLResult, Selection, TrainResult
    from pivot_envs.evaluate import Accuracy, EvalReport, EvalRow
    from pivot_envs.profile import ProfileRun

    profiled = [
        Pivot(
            f"t{i}/t0",
            "tool-use",
            [{"role": "user", "content": "hi"}],
            {"role": "assistant", "content": "hello"},
            source={"trajectory": f"t{i}"},
            profile=Profile.from_samples(rewards),
        )
        for i, rewards in enumerate(([1.0, 0.0], [0.0, 0.0]))
    ]
    history = [
        {
            "step": step,
            "reward_mean": 0.5,
            "reward_std": 0.5,
            "frac_zero_variance": 0.0,
            "loss": 0.1,
            "groups_trained": 1,
        }
        for step in (1, 2)
    ]
    metrics = out / "train" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text("".join(json.dumps(record) + "\n" for record in history))
    accuracy = Accuracy.of([1.0, 0.0])
    report = EvalReport("hf:smollm2", [EvalRow("tool-use", "greedy", 2, 1, accuracy, accuracy, 0)])
    timings = dict.fromkeys(
        ("extract", "split", "sft", "profile", "filter", "eval_before", "train", "eval_after"), 1.0
    )
    result = PivotRLResult(
        Selection(profiled, profiled, profiled[:1], ProfileRun()),
        TrainResult(out.parent, 2, out / "final", metrics, history),
    )
    return dict(
        out=out,
        config=RunConfig(out=str(out)),
        extracted=profiled,
        trajectories={"t0", "t1"},
        train_side=profiled,
        heldout=profiled[:1],
        result=result,
        note="",
        diagnostics="(diagnostics)",
        before=report,
        after=report,
        timings=timings,
        signal=Signal.of(result, 1),
        warm=WarmUp(),
    )


def test_the_run_report_links_the_reward_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pivot_envs.adapters.cli_run import write_report

    report = write_report(**_report_inputs(tmp_path)).read_text()
    assert "![reward mean and std over steps](rewards.png)" in report
    assert (tmp_path / "rewards.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_run_report_is_written_and_says_the_plot_was_skipped(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    from pivot_envs.adapters.cli_run import write_report

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with caplog.at_level(logging.WARNING, logger="pivot_envs"):
        report = write_report(**_report_inputs(tmp_path)).read_text()
    assert (
        "The reward plot was skipped: matplotlib is not installed (`pip install 'pivot-envs[plot]'`)."
        in report
    )
    assert "rewards.png" not in report and not (tmp_path / "rewards.png").exists()
    assert "| 2 | 0.500 | 0.500 | 0.00 | 0.1000 |" in report  # the figures are all there
    assert json.loads((tmp_path / "report.json").read_text())["pivots"] == 1
    assert [r.getMessage() for r in caplog.records] == [
        "the report has no reward plot: plotting the training rewards needs 'matplotlib', which is not installed: "
        "pip install 'pivot-envs[plot]'"
    ]


@pytest.mark.parametrize("command", ["train", "stats"])
def test_plot_flags_without_matplotlib_are_refused_before_any_work(
    tmp_path: Path, capsys, monkeypatch, command
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    if command == "train":
        argv = [
            "train",
            "--pivots",
            str(candidates(tmp_path)),
            "--policy",
            NO_MODEL,
            "--out",
            str(tmp_path / "out"),
            "--plot",
        ]
    else:
        argv = ["stats", str(_profiled(tmp_path)), "--plot", str(tmp_path / "out")]
    assert main(argv) == 1
    assert error_line(capsys) == (
        f"pivotrl {command}: error: {command} --plot needs 'matplotlib', which is not installed: pip install 'pivot-envs[plot]'"
    )
    assert not (tmp_path / "out").exists()
