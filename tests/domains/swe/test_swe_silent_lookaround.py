"""Look-around pivots whose expert call shows nothing (a grep with no match, `git diff` in a clean
tree, a view of an empty file): a call that also shows nothing scores only as the expert's call or a
near copy of it, since matching "nothing" would reward any silent call (`true`). No bundled pivot is
such a pivot, so these are built on the tests' own repository (swe_helpers.py). Also: the
too-much-output bound counts the whole outputs, not only the lines compared."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from sandbox_fixtures import FAST_LIMITS
from swe_helpers import calc_pivot, call_message

from pivot_envs.domains.swe import SweEnv
from pivot_envs.domains.swe.verifier import SILENT_SIMILARITY, call_similarity

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "redteam"))
from attacks_swe import FAMILIES  # noqa: E402
from redteam_common import run_family  # noqa: E402

LIMITS = dataclasses.asdict(FAST_LIMITS) | {"timeout": 10.0}
GREP = "grep -rn 'def median' --include=*.py ."
# The expert's look-around at each pivot: each shows nothing there (the prefix is the grep of turn 0).
SILENT = {
    "calc-mean/grep-no-match": ("bash", {"command": GREP}),
    "calc-mean/git-diff-clean": ("bash", {"command": "git diff"}),
    "calc-mean/view-empty-file": (
        "str_replace_editor",
        {"command": "view", "path": "/repo/calc/__init__.py"},
    ),
    # shows 700 lines: for the too-much-output bound past max_lines
    "calc-mean/seq-700": ("bash", {"command": "seq 1 700"}),
}


@pytest.fixture(scope="module")
def env(calc_repo, has_bwrap):
    pivots = [
        dataclasses.replace(calc_pivot(calc_repo, 1), id=pivot_id, expert=call_message(name, arguments, 1))
        for pivot_id, (name, arguments) in SILENT.items()
    ]
    made = SweEnv(pivots, sandbox="bwrap", limits=LIMITS)
    yield made
    made.close()


def score(env: SweEnv, pivot_id: str, name: str, arguments: dict) -> tuple[float, str]:
    env.reset(options={"pivot": pivot_id})
    _, reward, _, _, info = env.step(call_message(name, arguments))
    assert info["valid"], info
    return reward, info["category"]


SILENT_PIVOTS = [pivot_id for pivot_id in SILENT if pivot_id != "calc-mean/seq-700"]


@pytest.mark.parametrize("pivot_id", SILENT_PIVOTS)
@pytest.mark.parametrize(
    "command", ["true", ":", "echo", "ls /nonexistent 2>/dev/null", "grep -rn 'def mode' --include=*.py ."]
)
def test_a_silent_call_scores_zero_where_the_experts_look_around_shows_nothing(env, pivot_id, command):
    assert score(env, pivot_id, "bash", {"command": command}) == (0.0, "expert_shows_nothing")


@pytest.mark.parametrize("pivot_id", SILENT_PIVOTS)
def test_the_experts_own_call_still_scores_where_it_shows_nothing(env, pivot_id):
    name, arguments = SILENT[pivot_id]
    assert score(env, pivot_id, name, arguments) == (1.0, "same_call")


def test_the_experts_command_written_differently_or_its_file_by_another_path_is_the_same_call(env):
    respaced = {"command": 'grep  -rn "def median"  --include=*.py .'}
    assert score(env, "calc-mean/grep-no-match", "bash", respaced) == (1.0, "same_call")
    dotted = {"command": "view", "path": "/repo/calc/./__init__.py"}
    assert score(env, "calc-mean/view-empty-file", "str_replace_editor", dotted) == (1.0, "same_call")


def test_another_tool_showing_the_same_nothing_is_not_the_experts_call(env):
    # `cat` of the empty file shows what `true` shows: the text cannot tell them apart by effect.
    cat = {"command": "cat calc/__init__.py"}
    assert score(env, "calc-mean/view-empty-file", "bash", cat) == (0.0, "expert_shows_nothing")


def test_a_call_that_shows_something_where_the_expert_shows_nothing_shows_other_output(env):
    assert score(env, "calc-mean/grep-no-match", "bash", {"command": "echo unrelated text"}) == (
        0.0,
        "different_output",
    )


def bash(command: str) -> tuple[str, dict]:
    return "bash", {"command": command}


def test_a_near_copy_of_a_long_command_is_similar_and_a_short_command_has_none():
    long = "grep -rn -e alpha -e beta -e gamma -e delta -e epsilon -e zeta -e eta -e theta -e iota --include=*.py ."
    near = long.replace(" .", " -s .")
    assert SILENT_SIMILARITY <= call_similarity(bash(near), bash(long), "/repo") < 1.0
    assert call_similarity(bash("grep -rn 'def mode' ."), bash("grep -rn 'def median' ."), "/repo") < 0.95
    assert call_similarity(bash("true"), ("str_replace_editor", {"command": "view"}), "/repo") == 0.0


def test_the_silent_look_around_family_scores_zero_where_the_expert_shows_nothing(env):
    pivots = [pivot for pivot in env.pivots if pivot.id in SILENT_PIVOTS]
    tally = run_family(env, FAMILIES["silent_look_around"], pivots)
    assert (tally.applicable, tally.scored, tally.invalid) == (3, 0, 0), tally.examples


def test_the_too_much_output_bound_counts_lines_past_the_ones_compared(env):
    # 700 lines: the bound is 3 * 700 + 50 = 2150 lines, past max_lines (2,000), where the sample was cut.
    padded = {"command": "seq 1 700; yes | head -n 3000"}
    assert score(env, "calc-mean/seq-700", "bash", padded) == (0.0, "too_much_output")
    within = {"command": "seq 1 700; yes | head -n 1000"}
    assert score(env, "calc-mean/seq-700", "bash", within) == (1.0, "covers_expert_output")
