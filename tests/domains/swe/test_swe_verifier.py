"""The verifier levels: where the paper's `name` level is wrong and `effect` is right (a wrong edit
with the right tool, an equivalent edit written differently, another search command), and the
`kind` and `nemo` levels."""

from __future__ import annotations

import dataclasses

import pytest
from sandbox_fixtures import FAST_LIMITS
from swe_helpers import FIX_OLD, calc_pivot, call_message

from pivot_envs.domains.swe import KindVerifier, NameVerifier, NemoVerifier, SweEnv, canonical_call
from pivot_envs.domains.swe.verifier import coverage, named_tests, output_lines

LIMITS = dataclasses.asdict(FAST_LIMITS) | {"timeout": 10.0}
OPS = "/repo/calc/ops.py"


@pytest.fixture(scope="module")
def env(calc_pivots, has_bwrap):
    made = SweEnv(calc_pivots, sandbox="bwrap", limits=LIMITS)
    yield made
    made.close()


def scores(env: SweEnv, pivot_id: str, name: str, arguments: dict) -> tuple[float, str, float]:
    """(effect reward, effect category, the paper's name-level reward) of one call at a pivot."""
    env.reset(options={"pivot": pivot_id})
    _, reward, _, _, info = env.step(call_message(name, arguments))
    assert info["valid"], info
    return reward, info["category"], NameVerifier().verify(env.pivot, info["parsed"]).reward


def replace(old: str, new: str) -> dict:
    return {"command": "str_replace", "path": OPS, "old_str": old, "new_str": new}


def test_a_wrong_edit_with_the_right_tool_passes_name_and_fails_effect(env):
    wrong = replace(FIX_OLD, "    return sum(values) / (len(values) - 1)")
    assert scores(env, "calc-mean/t2", "str_replace_editor", wrong) == (0.0, "different_edit", 1.0)


def test_an_edit_elsewhere_with_the_right_tool_touches_none_of_the_experts_hunks(env):
    elsewhere = replace("    return a + b", "    return b + a")
    assert scores(env, "calc-mean/t2", "str_replace_editor", elsewhere) == (0.0, "different_edit", 1.0)


def test_the_same_edit_made_with_sed_fails_name_and_passes_effect(env):
    command = "sed -i 's|/ (len(values) + 1)|/ len(values)|' calc/ops.py"
    assert scores(env, "calc-mean/t2", "bash", {"command": command}) == (1.0, "same_files", 0.0)


def test_an_equivalent_edit_written_differently_has_the_experts_ast(env):
    spaced = replace(FIX_OLD, "    return (sum(values)/len(values))")
    assert scores(env, "calc-mean/t2", "str_replace_editor", spaced) == (1.0, "equivalent_edit", 1.0)


def test_another_fix_of_the_same_lines_passes_when_the_tests_are_at_least_as_good(env):
    other = replace(FIX_OLD, "    total = sum(values)\n    return total / len(values)")
    assert scores(env, "calc-mean/t2", "str_replace_editor", other)[:2] == (1.0, "overlapping_edit")


def test_git_grep_instead_of_grep_shows_the_same_matches(env):
    # rg is not in the base image: git grep is the differently written search here.
    assert scores(env, "calc-mean/t0", "bash", {"command": "git grep -n 'def mean'"}) == (
        1.0,
        "covers_expert_output",
        1.0,
    )
    assert scores(env, "calc-mean/t0", "bash", {"command": "grep -rnw mean --include=*.py calc"})[:2] == (
        1.0,
        "covers_expert_output",
    )


def test_a_look_around_that_shows_nothing_of_the_experts_passes_name_and_fails_effect(env):
    assert scores(env, "calc-mean/t0", "bash", {"command": "ls"}) == (0.0, "different_output", 1.0)


def test_cat_n_instead_of_the_editors_view_fails_name_and_passes_effect(env):
    assert scores(env, "calc-mean/t1", "bash", {"command": "cat -n calc/ops.py"}) == (
        1.0,
        "covers_expert_output",
        0.0,
    )


def test_a_look_around_that_edits_files_fails(env):
    command = "cat -n calc/ops.py; touch calc/scratch.py"
    assert scores(env, "calc-mean/t1", "bash", {"command": command})[:2] == (0.0, "changed_files")


def test_a_test_run_passes_when_it_runs_the_experts_tests_with_the_same_outcome(env):
    verbose = {"command": "python3 -m unittest -v tests.test_ops.MeanTests 2>&1 | tail -3"}
    assert scores(env, "calc-mean/t3", "bash", verbose)[:2] == (1.0, "same_tests")
    others = {"command": "python3 -m unittest tests.test_ops.AddTests"}
    assert scores(env, "calc-mean/t3", "bash", others) == (0.0, "different_tests", 1.0)


def test_submit_scores_one_only_where_the_expert_submits_with_the_fail_to_pass_tests_passing(env, calc_repo):
    assert scores(env, "calc-mean/t4", "submit", {})[:2] == (1.0, "submitted_fixed")
    assert scores(env, "calc-mean/t2", "submit", {}) == (0.0, "premature_submit", 0.0)
    assert scores(env, "calc-mean/t4", "bash", {"command": "git diff"})[:2] == (0.0, "not_submitted")
    unfixed = calc_pivot(calc_repo, 2)  # the expert "submits" before its edit: the bug is still there
    unfixed = dataclasses.replace(unfixed, id="calc-mean/unfixed", expert=canonical_call("submit", {}))
    # Its own env builds the prefix state and runs the tests cold: the default 30 s per command, so
    # a loaded machine (the whole suite on 2 cores) cannot turn the verdict into a timeout.
    fresh = SweEnv([unfixed], sandbox="bwrap", limits=LIMITS | {"timeout": 30.0})
    try:
        fresh.reset()
        _, reward, _, _, info = fresh.step(call_message("submit", {}))
        assert (reward, info["category"]) == (0.0, "submitted_unfixed"), info.get("detail")
    finally:
        fresh.close()


def test_a_refused_call_scores_zero_with_the_tools_category(env):
    missing = replace("not in the file", "x")
    assert scores(env, "calc-mean/t2", "str_replace_editor", missing)[:2] == (0.0, "old_str_not_found")
    outside = {"command": "view", "path": "/etc/passwd"}
    assert scores(env, "calc-mean/t1", "str_replace_editor", outside)[:2] == (0.0, "outside_repo")


def test_the_kind_level_tells_search_from_view_where_name_cannot(calc_pivots):
    grep_pivot = calc_pivots[0]
    view = canonical_call("bash", {"command": "cat calc/ops.py"})
    assert NameVerifier().verify(grep_pivot, view).reward == 1.0
    assert KindVerifier().verify(grep_pivot, view).category == "different_kind"
    assert (
        KindVerifier().verify(grep_pivot, canonical_call("bash", {"command": "find . -name ops.py"})).reward
        == 1.0
    )


def test_the_nemo_level_checks_category_target_and_argument_similarity(calc_pivots):
    edit_pivot, test_pivot = calc_pivots[2], calc_pivots[3]
    nemo = NemoVerifier()
    expert = dict(edit_pivot.expert["tool_calls"][0]["function"])
    same = canonical_call("file_editor", expert["arguments"])  # another harness's name for the editor
    assert nemo.verify(edit_pivot, same).category == "nemo_match"
    other_file = canonical_call(
        "str_replace_editor", replace(FIX_OLD, "x") | {"path": "/repo/tests/test_ops.py"}
    )
    assert nemo.verify(edit_pivot, other_file).category == "target_mismatch"
    far = canonical_call(
        "str_replace_editor", replace(FIX_OLD, "    raise NotImplementedError('mean is not done')")
    )
    assert nemo.verify(edit_pivot, far).category == "similarity_below_threshold"
    assert nemo.verify(edit_pivot, canonical_call("bash", {"command": "ls"})).category == "tool_name_mismatch"
    run = canonical_call("execute_bash", {"command": "python3 -m unittest tests.test_ops.MeanTests -v"})
    assert nemo.verify(test_pivot, run).reward == 1.0


def test_output_lines_drop_line_numbers_and_path_prefixes_so_coverage_compares_content():
    grep = output_lines("./calc/ops.py:5:def mean(values):\n", "/repo", 100)
    git_grep = output_lines("calc/ops.py:5:def mean(values):\n", "/repo", 100)
    editor = output_lines(
        "Here's the result of running `cat -n` on /repo/x.py:\n     1\tdef f():\n", "/repo", 100
    )
    assert grep == git_grep == ["calc/ops.py:def mean(values):"] and editor == ["def f():"]
    assert coverage(["a", "b", "b"], ["b", "a"]) == pytest.approx(2 / 3)
    assert coverage([], []) == 1.0 and coverage([], ["x"]) == 0.0


def test_test_ids_are_normalised_across_runners():
    assert named_tests("python -m pytest -q tests/test_ops.py::MeanTests") == {"tests.test_ops.MeanTests"}
    assert named_tests("cd /repo && python3 -m unittest -v tests.test_ops.MeanTests 2>&1") == {
        "tests.test_ops.MeanTests"
    }
    assert named_tests("python3 -m unittest") == {"*"}


# -- the text beside the call (call_text) --------------------------------------------------------------

STUFFED = "The bug is fixed and every test passes. " * 1500  # 60 KB


def with_text(message: dict, text: str) -> dict:
    return {**message, "content": text}


def test_the_expert_and_a_short_courtesy_text_beside_its_call_score_one_and_60_kb_does_not(env):
    for pivot_id in ("calc-mean/t0", "calc-mean/t2", "calc-mean/t3"):
        env.reset(options={"pivot": pivot_id})
        expert = env.pivot.expert
        _, reward, _, _, info = env.step(expert)
        assert reward == 1.0, info
        env.reset(options={"pivot": pivot_id})
        _, reward, _, _, info = env.step(with_text(expert, "Let me look at that."))
        assert reward == 1.0, info
        env.reset(options={"pivot": pivot_id})
        _, reward, _, _, info = env.step(with_text(expert, STUFFED))
        assert (reward, info["category"], info["valid"]) == (0.0, "call_text_too_long", True)
        assert "at most 300 more (call_text_extra_chars)" in info["detail"]


def unexecuted(calc_repo, expert_text: str | None = None):
    """calc-mean/t0 as a pivot whose repository is not here (scored at the nemo level, no sandbox)."""
    pivot = calc_pivot(calc_repo, 0, executable=False, not_executable_reason="test")
    return dataclasses.replace(pivot, expert=with_text(pivot.expert, expert_text))


def step(env: SweEnv, action) -> tuple[float, str]:
    env.reset(options={"pivot": "calc-mean/t0"})
    _, reward, _, _, info = env.step(action)
    return reward, info["category"]


def test_the_text_around_a_tool_call_block_is_read_and_reasoning_is_not(calc_repo):
    made = SweEnv([unexecuted(calc_repo)])
    block = '<tool_call>{"name": "bash", "arguments": {"command": "grep -rn \'def mean\' --include=*.py ."}}</tool_call>'
    assert step(made, made.pivots[0].expert) == (1.0, "nemo_match")
    assert step(made, f"Let me find mean.\n{block}") == (1.0, "nemo_match")
    assert step(made, f"{STUFFED}\n{block}") == (0.0, "call_text_too_long")
    assert step(made, f"<think>{STUFFED}</think>\n{block}") == (1.0, "nemo_match")
    made.close()
    off = SweEnv([unexecuted(calc_repo)], verifier_config={"call_text": False})
    assert step(off, f"{STUFFED}\n{block}") == (1.0, "nemo_match")
    off.close()


def test_the_bound_follows_the_experts_own_text_beside_its_call(calc_repo):
    said = (
        "THOUGHT: the mean is off by one; I will find where it is defined before reading it. " * 8
    ).strip()
    made = SweEnv([unexecuted(calc_repo, said)])
    assert made.pivots[0].expert["content"] is None  # the canonical form drops it; the env keeps it aside
    assert step(made, unexecuted(calc_repo, said).expert) == (1.0, "nemo_match")
    call = made.pivots[0].expert
    assert step(made, with_text(call, said + "\n\n " + "x" * 299)) == (1.0, "nemo_match")
    assert step(made, with_text(call, said + " " + "x" * 300)) == (0.0, "call_text_too_long")
    made.close()


def test_the_effect_verifiers_call_text_options_are_checked():
    from pivot_envs.config import ConfigError
    from pivot_envs.domains.swe import EffectVerifier

    with pytest.raises(ConfigError, match="call_text_extra_chars"):
        EffectVerifier(call_text_extra_chars=-1)
    with pytest.raises(ConfigError, match="call_text"):
        EffectVerifier(call_text=1)
