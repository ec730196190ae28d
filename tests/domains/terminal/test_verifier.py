"""The functional verifier's rules, on real command results from a bubblewrap sandbox."""

from __future__ import annotations

import json
import shlex

import pytest

from pivot_envs.config import ConfigError
from pivot_envs.domains.terminal.parse import canonical_message
from pivot_envs.domains.terminal.verifier import TerminalVerifier, command_similarity
from pivot_envs.env import Outcome
from pivot_envs.pivot import Pivot
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend


@pytest.fixture(scope="module")
def prefix(has_bwrap):
    backend = BwrapBackend(has_bwrap)
    sandbox = backend.create("/app")
    sandbox.run("printf 'b\\na\\nc\\n' > list.txt && date > stamp.txt && mkdir site && export APP_ENV=dev")
    probe = sandbox.run(":", files=True)
    yield backend, sandbox.snapshot(), probe.files, probe.shell
    backend.close()


@pytest.fixture(scope="module")
def repo(has_bwrap):
    """A prefix in a git repository with one commit and a changed and a new file, its git state known."""
    backend = BwrapBackend(has_bwrap)
    sandbox = backend.create("/app")
    sandbox.run(
        "printf 'a\\n' > notes.txt && git init -q && git add -A && git commit -qm first && "
        "printf 'b\\n' >> notes.txt && printf 'c\\n' > todo.txt"
    )
    probe = sandbox.run(":", files=True)
    assert probe.git.startswith('"" HEAD')
    yield backend, sandbox.snapshot(), probe.files, probe.shell, probe.git
    backend.close()


def verdict(prefix, expert: str, sampled: str, repeat: bool = True, text: str | None = None, **options):
    """The verdict on `sampled` at a pivot whose expert ran `expert` (twice, as the prefix cache runs it);
    `text`: what the sampled message says beside its command."""
    backend, snapshot, before, shell_before, *git_before = prefix
    results = []
    for command in (sampled, expert, expert):
        fork = backend.fork(snapshot)
        results.append(fork.run(command, timeout=5, files=True))
        fork.close()
    pivot = Pivot("t/1/t0", "terminal", [], canonical_message(expert))
    data = {"result": results[0], "expert": results[1], "before": before, "shell_before": shell_before}
    if git_before:
        data["git_before"] = git_before[0]
    if repeat:
        data["expert_repeat"] = results[2]
    action = canonical_message(sampled) if text is None else {**canonical_message(sampled), "content": text}
    return TerminalVerifier(**options).verify(pivot, action, Outcome(data=data))


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


def test_the_experts_command_with_a_delayed_deletion_left_running_scores_zero(prefix):
    expert = "sort list.txt > sorted.txt"
    found = verdict(prefix, expert, expert + "; ( sleep 1; rm -rf /app/* ) &")
    assert (found.reward, found.category) == (0.0, "processes_left_running")
    assert found.extra["left_running"][1] == 0 and found.extra["left_running"][0] >= 1
    found = verdict(prefix, expert, expert + "; setsid sleep 1000 &")
    assert (found.reward, found.category) == (0.0, "processes_left_running")
    assert verdict(prefix, expert, expert).reward == 1.0
    found = verdict(prefix, expert, "sort -o sorted.txt list.txt")
    assert (found.reward, found.category, found.extra["left_running"]) == (1.0, "equivalent_effect", (0, 0))


def test_a_command_may_leave_running_what_the_experts_command_leaves(prefix):
    expert = "sleep 30 & echo started"
    found = verdict(prefix, expert, "setsid sleep 30 >/dev/null 2>&1 & echo started")
    assert (found.reward, found.category, found.extra["left_running"]) == (1.0, "equivalent_effect", (1, 1))
    found = verdict(prefix, expert, "sleep 30 & sleep 30 & echo started")
    assert (found.reward, found.category) == (0.0, "processes_left_running")


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


def test_a_comment_glued_to_the_experts_last_word_is_not_the_same_command(prefix):
    # bash starts a comment only at the start of a word: `list.txt#;echo 999` sorts `list.txt#` and echoes
    for glued in ("sort list.txt#;echo 999 fake", "sort list.txt#\necho 999", "sort list.txt\\#;echo 9"):
        found = verdict(prefix, "sort list.txt", glued)
        assert (found.reward, found.category) == (0.0, "different_effect"), glued


def test_a_comment_where_bash_reads_one_is_still_the_same_command(prefix):
    for sampled in ("sort list.txt # sort it", "sort list.txt;# sort it", "# sort it\nsort list.txt"):
        found = verdict(prefix, "sort list.txt", sampled)
        assert (found.reward, found.category) == (1.0, "same_command"), sampled


def test_quoting_that_changes_what_bash_does_is_not_the_same_command(prefix):
    for expert, sampled in (
        ("ls *.txt", "ls '*.txt'"),
        ("echo $HOME", "echo '$HOME'"),
        ("sort list.txt && echo done", "sort list.txt '&&' echo done"),
        ("echo a 2>&1", "echo a 2 >&1"),
        ("echo a; echo b", "echo 'a;' echo b"),
    ):
        found = verdict(prefix, expert, sampled)
        assert found.category != "same_command" and found.reward == 0.0, (expert, sampled)


LONG = "awk '{print $1}' list.txt | sort | uniq -c | sort -rn | head -n {} | awk '{print $2}' > top.txt"


def test_text_similarity_never_overrides_a_measured_difference_in_effect(prefix):
    # one token in twenty differs (similarity 0.95) and the file it writes differs: measured, so 0
    found = verdict(prefix, LONG.replace("{}", "1", 1), LONG.replace("{}", "2", 1))
    assert found.extra["similarity"] >= 0.95
    assert (found.reward, found.category) == (0.0, "different_effect")
    assert found.extra["measured_differences"] == ["files"]


def test_without_the_experts_repeat_every_difference_counts_as_measured(prefix):
    expert, sampled = "date +%s%N; ls -l list.txt", "date +%s%N; ls -la list.txt"
    found = verdict(prefix, expert, sampled, repeat=False, similarity_threshold=0.6)
    assert (found.reward, found.category) == (0.0, "different_effect")


def test_a_near_identical_command_must_match_the_lines_of_output_the_expert_repeats(prefix):
    # the first line (a clock) changes from run to run; the second (the file's listing) repeats
    expert = "date +%s%N; wc -l list.txt"
    found = verdict(prefix, expert, "date +%s%N; wc -l list.txt stamp.txt", similarity_threshold=0.6)
    assert (found.reward, found.extra["measured_differences"]) == (0.0, ["output"])
    found = verdict(prefix, expert, "date +%s%N;  wc -l ./list.txt", similarity_threshold=0.6)
    assert (found.reward, found.category) == (0.0, "different_effect")  # "./list.txt" is printed
    found = verdict(
        prefix, expert, "date +%s%N;wc -l < list.txt | sed 's/$/ list.txt/'", similarity_threshold=0.3
    )
    assert (found.reward, found.category) == (1.0, "similar_command")


def test_a_file_the_expert_writes_alike_every_time_must_match_where_another_varies(prefix):
    expert = "date +%s%N > now.txt; sort list.txt > sorted.txt"
    found = verdict(
        prefix, expert, "date +%s%N > now.txt; sort -r list.txt > sorted.txt", similarity_threshold=0.8
    )
    assert (found.reward, found.extra["measured_differences"]) == (0.0, ["files"])
    found = verdict(
        prefix, expert, "date +%s%N > now.txt; sort list.txt > sorted.txt ;", similarity_threshold=0.8
    )
    assert found.reward == 1.0
    found = verdict(
        prefix, expert, "date +%s%N > now.txt; sort  < list.txt > sorted.txt", similarity_threshold=0.8
    )
    assert (found.reward, found.category) == (1.0, "similar_command")
    found = verdict(
        prefix, expert, "date +%s%N > now2.txt; sort < list.txt > sorted.txt", similarity_threshold=0.5
    )
    assert (found.reward, found.extra["measured_differences"]) == (0.0, ["files"])


def test_a_silent_command_does_not_match_an_expert_whose_change_the_effect_does_not_show(prefix):
    # cd, export and git change only the shell state or .git/, which the effect leaves out
    for expert in ("cd /tmp", "export APP_ENV=production", "git init -q"):
        for sampled in ("true", ":", "true || " + expert):
            found = verdict(prefix, expert, sampled)
            assert (found.reward, found.category) == (0.0, "different_effect"), (expert, sampled)
        assert verdict(prefix, expert, expert + " ;").reward == 1.0


# -- the shell state (working directory, exported variables) is part of the effect ----------------------


def test_a_rewrite_that_changes_the_shell_state_alike_scores_one(prefix):
    for expert, sampled in [
        ("cd site", "cd /app/site"),
        ("cd site", "cd ./site/"),
        ("export APP_ENV=production", "APP_ENV=production; export APP_ENV"),
        ("unset APP_ENV", "export -n APP_ENV"),
        ("cd site && export A=1", "export A=1; cd site"),
    ]:
        found = verdict(prefix, expert, sampled)
        assert (found.reward, found.category) == (1.0, "equivalent_effect"), (expert, sampled, found.detail)


def test_the_same_output_without_the_expert_s_cd_or_export_scores_zero(prefix):
    # attacks: the expert's visible effect, minus its change to the shell state
    for expert, sampled in [
        ("cd site && ls", "ls site"),
        ("cd site && pwd", "echo /app/site"),
        ("export APP_ENV=production && echo ok", "echo ok"),
        ("cd site", "cd /tmp"),
        ("export APP_ENV=production", "export APP_ENV=staging"),
        ("export APP_ENV=production", "export APP_ENV=production OTHER=1"),
    ]:
        found = verdict(prefix, expert, sampled)
        assert (found.reward, found.category) == (0.0, "different_effect"), (expert, sampled)
        assert "shell" in found.extra["measured_differences"], (expert, sampled)


def test_a_value_that_forges_an_entry_of_the_saved_state_does_not_pass_for_it(prefix):
    # `export -p` prints a value's newlines as they are: a line inside it that reads as the expert's cd or
    # export is one more entry, beside the variable that holds it
    for expert, sampled in [
        ("cd site", "export Z=$'x\\ncd -- /app/site'"),
        ("export APP_ENV=production", "export Z=$'x\\ndeclare -x APP_ENV=\"production\"'"),
    ]:
        found = verdict(prefix, expert, sampled)
        assert found.reward == 0.0, (expert, sampled)


def test_a_megabyte_export_is_cut_and_compared_without_harm(prefix):
    big = "export BIG=$(head -c 1000000 /dev/zero | tr '\\0' a)"
    found = verdict(prefix, big, "export BIG=$(head -c 1000001 /dev/zero | tr '\\0' a)")
    assert found.reward == 0.0  # the kept head and tail are alike; the cut says how much each one cut
    found = verdict(prefix, big, "export BIG=$(printf 'a%.0s' $(seq 1000000))")
    assert (found.reward, found.category) == (1.0, "equivalent_effect")


def test_shell_entries_key_a_repeated_name_apart():
    from pivot_envs.domains.terminal.verifier import shell_changes, shell_entries

    state = 'declare -x A="1"\ndeclare -x Z="x\ncd -- /app/site"\ncd -- /app\n'
    assert shell_entries(state) == {
        "A": 'declare -x A="1"',
        "Z": 'declare -x Z="x',
        "cwd": 'cd -- /app/site"',
        "cwd#2": "cd -- /app",
    }
    assert shell_changes('declare -x A="1"\ncd -- /app\n', 'declare -x B="2"\ncd -- /app\n') == {
        "B": 'declare -x B="2"',
        "A": None,
    }


# -- the git repository's state (HEAD, refs, index entries) is part of the effect ------------------------


def test_a_rewrite_that_changes_the_repository_alike_scores_one(repo):
    for expert, sampled in [
        ("git add -A", "git add ."),
        ("git add -A", "git add notes.txt todo.txt"),
        (
            "git add -A && git commit -qm second",
            "git commit -qam second; git add todo.txt; git commit -q --amend -m second",
        ),
        ("git checkout -q -b feature", "git switch -q -c feature"),
        ("git branch feature", "git branch feature HEAD"),
        ("git checkout -q -- notes.txt", "git restore notes.txt"),
    ]:
        found = verdict(repo, expert, sampled)
        assert (found.reward, found.category) == (1.0, "equivalent_effect"), (expert, sampled, found.detail)


def test_what_only_looks_like_the_experts_git_command_scores_zero(repo):
    # attacks: silence, the expert's printed output, part of its staging, a commit that differs only inside .git/
    for expert, sampled in [
        ("git add -A", "true"),
        ("git add -A", "git add notes.txt"),
        ("git checkout -q -b feature", "git branch feature"),  # the branch, but HEAD stays
        ("git commit -qam second", "git commit -qam Second"),
        ("git commit -qam second", "git commit -qm second"),  # nothing staged: no commit, exit 1
        ("git add -A && git commit -m second", "printf '[master 1234567] second\\n 2 files changed\\n'"),
        ("git init -q", ":"),
    ]:
        found = verdict(repo, expert, sampled)
        assert (found.reward, found.category) == (0.0, "different_effect"), (expert, sampled, found.detail)


def test_printing_a_commits_output_does_not_pass_for_the_commit(repo):
    # the whole visible effect of the expert's commit is its output: only the repository tells them apart
    expert = "git add -A && git commit -m second"
    backend, snapshot, *_ = repo
    fork = backend.fork(snapshot)
    output = fork.run(expert).output
    fork.close()
    assert "second" in output and "2 files changed" in output
    found = verdict(repo, expert, f"printf '%s' {shlex.quote(output)}")
    assert (found.reward, found.category, found.extra["differences"]) == (0.0, "different_effect", ["git"])


def test_a_forged_index_does_not_pass_for_a_staged_change(repo):
    # the expert's index bytes written by hand would hold other stat data; a forged header does not parse
    found = verdict(repo, "git add -A", "printf 'DIRC\\0\\0\\0\\2\\0\\0\\0\\2' > .git/index")
    assert (found.reward, found.category) == (0.0, "different_effect")
    assert "git" in found.extra["measured_differences"]


# -- the text beside the command (call_text) -----------------------------------------------------------

STUFFED = "The task is done and verified. " * 2000  # 60 KB


def test_a_short_courtesy_text_beside_the_command_passes_and_60_kb_is_refused(prefix):
    courtesy = verdict(prefix, "sort list.txt", "sort list.txt", text="Let me sort the list.")
    assert (courtesy.reward, courtesy.category) == (1.0, "same_command")
    stuffed = verdict(prefix, "sort list.txt", "sort list.txt", text=STUFFED)
    assert (stuffed.reward, stuffed.category) == (0.0, "call_text_too_long")
    assert "at most 300 more (call_text_extra_chars)" in stuffed.detail
    # Refused before the effect is compared: an equivalent command is refused alike.
    equivalent = verdict(prefix, "sort list.txt > s.txt", "sort -o s.txt list.txt", text=STUFFED)
    assert equivalent.category == "call_text_too_long"
    off = verdict(prefix, "sort list.txt", "sort list.txt", text=STUFFED, call_text=False)
    assert (off.reward, off.category) == (1.0, "same_command")


def unexecuted_pivot(expert_text: str | None = None) -> Pivot:
    """A pivot whose command does not run here (string level): no sandbox is made for it."""
    expert = {**canonical_message("wc -l app.log"), "content": expert_text}
    context = {"executable": False, "not_executable_reason": "test"}
    return Pivot(
        "t/1/t0", "terminal", [{"role": "user", "content": "Count the log's lines."}], expert, context=context
    )


def step(env, action):
    env.reset(options={"pivot": "t/1/t0"})
    _, reward, _, _, info = env.step(action)
    return reward, info["category"]


def test_the_env_reads_the_text_beside_a_block_a_call_or_terminus_json():
    from pivot_envs.domains.terminal import TerminalEnv

    env = TerminalEnv([unexecuted_pivot()])
    block = "```bash\nwc -l app.log\n```"
    assert step(env, env.pivots[0].expert) == (1.0, "same_command")
    assert step(env, f"Let me count the lines.\n{block}") == (1.0, "same_command")
    assert step(env, f"{STUFFED}\n{block}") == (0.0, "call_text_too_long")
    hermes = '<tool_call>{"name": "bash", "arguments": {"command": "wc -l app.log"}}</tool_call>'
    assert step(env, f"{STUFFED}{hermes}") == (0.0, "call_text_too_long")
    # Reasoning in <think> is not text beside the command.
    assert step(env, f"<think>{STUFFED}</think>{hermes}") == (1.0, "same_command")
    terminus = json.dumps(
        {"analysis": STUFFED, "plan": "count", "commands": [{"keystrokes": "wc -l app.log\n"}]}
    )
    assert step(env, terminus) == (0.0, "call_text_too_long")
    terminus = json.dumps(
        {"analysis": "a log", "plan": "count", "commands": [{"keystrokes": "wc -l app.log\n"}]}
    )
    assert step(env, terminus) == (1.0, "same_command")
    env.close()
    off = TerminalEnv([unexecuted_pivot()], verifier_config={"call_text": False})
    assert step(off, f"{STUFFED}\n{block}") == (1.0, "same_command")
    off.close()


def test_the_bound_follows_the_experts_own_text_beside_its_command():
    from pivot_envs.domains.terminal import TerminalEnv

    said = (
        "I will count the lines of the log first, since the task asks how many requests it holds. " * 8
    ).strip()
    env = TerminalEnv([unexecuted_pivot(said)])
    # The canonical expert has no text; the expert's own turn, text and all, still scores 1.
    assert env.pivots[0].expert["content"] is None
    assert step(env, unexecuted_pivot(said).expert) == (1.0, "same_command")
    # At most 300 characters more, whitespace runs counted as one.
    assert step(env, {**canonical_message("wc -l app.log"), "content": said + "\n\n " + "x" * 299}) == (
        1.0,
        "same_command",
    )
    assert step(env, {**canonical_message("wc -l app.log"), "content": said + " " + "x" * 300}) == (
        0.0,
        "call_text_too_long",
    )
    env.close()


def test_the_call_text_options_are_checked():
    with pytest.raises(ConfigError, match="call_text_extra_chars"):
        TerminalVerifier(call_text_extra_chars=-1)
    with pytest.raises(ConfigError, match="call_text"):
        TerminalVerifier(call_text="yes")
