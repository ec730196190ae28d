"""The functional verifier's rules, on real command results from a bubblewrap sandbox."""

from __future__ import annotations

import pytest
from pivot_envs.domains.terminal.parse import canonical_message
from pivot_envs.domains.terminal.verifier import TerminalVerifier, command_similarity
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend

from pivot_envs.env import Outcome
from pivot_envs.pivot import Pivot


@pytest.fixture(scope="module")
def prefix(has_bwrap):
    backend = BwrapBackend(has_bwrap)
    sandbox = backend.create("/app")
    sandbox.run("printf 'b\\na\\nc\\n' > list.txt && date > stamp.txt")
    before = sandbox.run(":", files=True).files
    yield backend, sandbox.snapshot(), before
    backend.close()


def verdict(prefix, expert: str, sampled: str, **options):
    backend, snapshot, before = prefix
    results = []
    for command in (sampled, expert):
        fork = backend.fork(snapshot)
        results.append(fork.run(command, timeout=2, files=True))
        fork.close()
    pivot = Pivot("t/1/t0", "terminal", [], canonical_message(expert))
    outcome = Outcome(data={"result": results[0], "expert": results[1], "before": before})
    return TerminalVerifier(**options).verify(pivot, canonical_message(sampled), outcome)


def test_the_expert_command_scores_one(prefix):
    assert verdict(prefix, "sort list.txt", "sort list.txt").reward == 1.0


def test_spacing_and_quoting_differences_are_the_same_command(prefix):
    found = verdict(prefix, "sort list.txt", "sort   'list.txt'")
    assert (found.reward, found.category) == (1.0, "same_command")


def test_a_different_command_with_the_same_effect_scores_one(prefix):
    found = verdict(prefix, "sort list.txt > sorted.txt", "sort -o sorted.txt list.txt")
    assert (found.reward, found.category) == (1.0, "equivalent_effect")


def test_same_output_but_different_file_changes_scores_zero(prefix):
    found = verdict(prefix, "sort list.txt > sorted.txt", "sort list.txt > other.txt")
    assert (found.reward, found.category) == (0.0, "different_effect")
    assert "files" in found.detail


def test_a_different_exit_status_scores_zero(prefix):
    found = verdict(prefix, "grep -q a list.txt", "grep -q zzz list.txt")
    assert found.reward == 0.0 and "exit_code" in found.extra["differences"]


def test_a_command_that_times_out_scores_zero(prefix):
    found = verdict(prefix, "cat list.txt", "sleep 30")
    assert (found.reward, found.category) == (0.0, "timed_out")


def test_a_near_identical_command_with_the_same_exit_status_is_accepted_when_output_is_not_deterministic(
    prefix,
):
    expert, sampled = (
        "date +%s%N > now.txt; cat now.txt list.txt",
        "date +%s%N > now.txt; cat now.txt  list.txt ",
    )
    assert verdict(prefix, expert, sampled).category in ("same_command", "similar_command")
    found = verdict(
        prefix, "date +%s%N; ls -l list.txt", "date +%s%N; ls -la list.txt", similarity_threshold=0.6
    )
    assert (found.reward, found.category) == (1.0, "similar_command")


def test_the_judge_decides_what_the_rules_reject(prefix):
    calls = []

    def judge(pivot, action, outcome):
        calls.append(action)
        return True

    found = verdict(prefix, "cat list.txt", "head -n 1 list.txt", judge=judge)
    assert (found.reward, found.category) == (1.0, "judge") and len(calls) == 1


def test_command_similarity_is_one_for_equal_token_sequences_and_lower_otherwise():
    assert command_similarity("ls  -la", "ls -la") == 1.0
    assert 0 < command_similarity("ls -la /tmp", "ls -l /tmp") < 1
