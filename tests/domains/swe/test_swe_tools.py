"""The coding agent's tools run for real in a sandbox: the editor's contract and texts (OpenHands /
SWE-agent), bash under both harnesses, submit, kinds, and the tree hash."""

from __future__ import annotations

import pytest
from swe_helpers import BUGGY, FIX_NEW, FIX_OLD, bug_patch

from pivot_envs.domains.swe import action_kind, default_tools, execute_call, tree_hash
from pivot_envs.domains.swe.repo import start_sandbox
from pivot_envs.errors import UnknownNameError

OPS = "/repo/calc/ops.py"


@pytest.fixture
def repo_sandbox(backend, calc_repo):
    """A sandbox of each backend holding the tiny repository with its bug, at /repo."""
    made = start_sandbox(backend, calc_repo, bug_patch())
    yield made
    made.close()


# The backend fixtures' 3 s limit is for commands that should be quick; a loaded machine needs more.
TIMEOUT = 20.0


def edit(sandbox, **arguments):
    return execute_call(sandbox, "str_replace_editor", arguments, timeout=TIMEOUT)


def bash(sandbox, command, harness="persistent"):
    return execute_call(sandbox, "bash", {"command": command}, harness=harness, timeout=TIMEOUT)


def test_view_numbers_lines_like_cat_n_and_honours_view_range(repo_sandbox):
    whole = edit(repo_sandbox, command="view", path=OPS)
    assert whole.error is None and whole.kind == "view"
    assert whole.text.startswith(f"Here's the result of running `cat -n` on {OPS}:\n     1\tdef add(a, b):\n")
    part = edit(repo_sandbox, command="view", path=OPS, view_range=[5, 6])
    assert part.text.splitlines()[1:] == ["     5\tdef mean(values):", "     6\t    if not values:"]
    bad = edit(repo_sandbox, command="view", path=OPS, view_range=[0, 3])
    assert bad.error == "invalid_arguments" and "Its first element `0`" in bad.text


def test_a_directory_view_lists_two_levels_without_hidden_entries(repo_sandbox):
    listing = edit(repo_sandbox, command="view", path="/repo")
    assert "/repo/calc/ops.py" in listing.text and "/repo/tests/test_ops.py" in listing.text
    assert "/repo/.git" not in listing.text


def test_str_replace_needs_a_unique_old_str_and_says_so_in_openhands_words(repo_sandbox):
    missing = edit(repo_sandbox, command="str_replace", path=OPS, old_str="return a * b", new_str="x")
    assert missing.error == "old_str_not_found"
    assert (
        missing.text
        == f"No replacement was performed, old_str `return a * b` did not appear verbatim in {OPS}."
    )
    several = edit(repo_sandbox, command="str_replace", path=OPS, old_str="    return", new_str="    return")
    assert several.error == "old_str_not_unique"
    assert several.text.startswith(
        "No replacement was performed. Multiple occurrences of old_str `    return` in lines [2,"
    )
    done = edit(repo_sandbox, command="str_replace", path=OPS, old_str=FIX_OLD, new_str=FIX_NEW)
    assert done.error is None and done.text.startswith(f"The file {OPS} has been edited.")
    assert f"     8\t{FIX_NEW}" in done.text
    assert FIX_NEW in bash(repo_sandbox, "cat calc/ops.py").output


def test_undo_edit_restores_the_files_last_edits_one_by_one(repo_sandbox):
    edit(repo_sandbox, command="str_replace", path=OPS, old_str=FIX_OLD, new_str=FIX_NEW)
    edit(repo_sandbox, command="insert", path=OPS, insert_line=0, new_str="# fixed")
    assert bash(repo_sandbox, "head -1 calc/ops.py").output == "# fixed\n"
    assert edit(repo_sandbox, command="undo_edit", path=OPS).error is None
    assert edit(repo_sandbox, command="undo_edit", path=OPS).error is None
    assert bash(repo_sandbox, "cat calc/ops.py").output == BUGGY
    nothing = edit(repo_sandbox, command="undo_edit", path=OPS)
    assert (nothing.error, nothing.text) == ("no_history", f"No edit history found for {OPS}.")


def test_the_undo_history_forks_with_the_sandbox(repo_sandbox):
    edit(repo_sandbox, command="str_replace", path=OPS, old_str=FIX_OLD, new_str=FIX_NEW)
    fork = repo_sandbox.fork(repo_sandbox.snapshot())
    try:
        assert edit(fork, command="undo_edit", path=OPS).error is None
        assert bash(fork, "cat calc/ops.py").output == BUGGY
    finally:
        fork.close()


def test_create_refuses_an_existing_file_and_undo_removes_a_created_one(repo_sandbox):
    exists = edit(repo_sandbox, command="create", path=OPS, file_text="x = 1\n")
    assert exists.error == "file_exists" and "Cannot overwrite files using command `create`." in exists.text
    made = edit(repo_sandbox, command="create", path="/repo/calc/new/util.py", file_text="x = 1\n")
    assert made.text == "File created successfully at: /repo/calc/new/util.py"
    assert "calc/new/util.py" in made.files
    edit(repo_sandbox, command="undo_edit", path="/repo/calc/new/util.py")
    assert bash(repo_sandbox, "test -e calc/new/util.py; echo $?").output == "1\n"


def test_paths_outside_the_repository_are_refused_even_through_a_link(repo_sandbox):
    assert edit(repo_sandbox, command="view", path="/etc/passwd").error == "outside_repo"
    assert edit(repo_sandbox, command="create", path="/tmp/x.py", file_text="").error == "outside_repo"
    bash(repo_sandbox, "ln -s /etc /repo/etc-link")
    assert edit(repo_sandbox, command="view", path="/repo/etc-link/passwd").error == "outside_repo"
    assert edit(repo_sandbox, command="view", path="calc/ops.py").error == "invalid_path"


def test_bad_calls_are_tool_errors_with_a_category_never_exceptions(repo_sandbox):
    assert execute_call(repo_sandbox, "str_replace_editor", "{not json").error == "invalid_arguments"
    assert edit(repo_sandbox, command="rewrite", path=OPS).error == "unknown_command"
    assert (
        edit(repo_sandbox, command="insert", path=OPS, insert_line=99, new_str="x").error
        == "invalid_arguments"
    )
    assert (
        edit(repo_sandbox, command="str_replace", path="/repo/calc", old_str="a", new_str="b").error
        == "is_directory"
    )
    assert execute_call(repo_sandbox, "python", {"code": "1"}).error == "unknown_tool"
    big = edit(repo_sandbox, command="create", path="/repo/big.py", file_text="x" * (10 << 20))
    assert big.error == "too_large"
    bash(repo_sandbox, "printf 'a\\0b' > blob.bin")
    assert edit(repo_sandbox, command="view", path="/repo/blob.bin").error == "binary_file"


def test_the_persistent_harness_keeps_the_shell_and_the_fresh_one_starts_each_call_in_the_repository(
    repo_sandbox,
):
    bash(repo_sandbox, "cd calc && export MARK=set")
    assert bash(repo_sandbox, 'echo "$PWD $MARK"').output == "/repo/calc set\n"
    fresh = bash(repo_sandbox, "cd tests; pwd", harness="fresh")
    assert fresh.text == "<returncode>0</returncode>\n<output>\n/repo/tests\n</output>"
    assert bash(repo_sandbox, "pwd", harness="fresh").output == "/repo\n"


def test_a_command_past_the_time_limit_is_killed_and_reported(repo_sandbox):
    result = execute_call(repo_sandbox, "bash", {"command": "sleep 30"}, timeout=1)
    assert result.error == "timeout" and "timed out" in result.text


def test_submit_shows_the_diff_of_every_change_new_files_included(repo_sandbox):
    edit(repo_sandbox, command="str_replace", path=OPS, old_str=FIX_OLD, new_str=FIX_NEW)
    edit(repo_sandbox, command="create", path="/repo/NOTES.md", file_text="fixed\n")
    result = execute_call(repo_sandbox, "finish", {}, timeout=TIMEOUT)
    assert result.kind == "submit" and result.error is None
    assert "+++ b/calc/ops.py" in result.text and "+++ b/NOTES.md" in result.text
    assert bash(repo_sandbox, "git status --short").output == " M calc/ops.py\n?? NOTES.md\n"


def test_the_tree_hash_follows_the_files_and_leaves_the_index_alone(repo_sandbox):
    start = tree_hash(repo_sandbox)
    edit(repo_sandbox, command="str_replace", path=OPS, old_str=FIX_OLD, new_str=FIX_NEW)
    edited = tree_hash(repo_sandbox)
    assert edited != start
    assert bash(repo_sandbox, "git diff --cached --stat").output == ""
    edit(repo_sandbox, command="undo_edit", path=OPS)
    assert tree_hash(repo_sandbox) == start


@pytest.mark.parametrize(
    ("name", "arguments", "kind"),
    [
        ("bash", {"command": "grep -rn 'def mean' ."}, "search"),
        ("execute_bash", {"command": "cd /repo && git grep -n mean"}, "search"),
        ("bash", {"command": "find . -name '*.py' | xargs grep -l mean"}, "search"),
        ("bash", {"command": "sed -n '1,20p' calc/ops.py"}, "view"),
        ("bash", {"command": "cat calc/ops.py | head"}, "view"),
        ("bash", {"command": "sed -i 's/a/b/' calc/ops.py"}, "edit"),
        ("bash", {"command": "echo 'x = 1' > calc/new.py"}, "edit"),
        ("bash", {"command": "python3 -m unittest tests.test_ops 2>&1 | tail"}, "test"),
        ("bash", {"command": "cd /repo && python -m pytest -q tests/test_ops.py"}, "test"),
        ("bash", {"command": "python3 reproduce.py > /dev/null"}, "run"),
        ("bash", {"command": "echo '>' hi"}, "other"),
        ("str_replace_editor", {"command": "view", "path": OPS}, "view"),
        ("str_replace_editor", {"command": "insert", "path": OPS}, "edit"),
        ("submit", {}, "submit"),
        ("think", {"thought": "x"}, "other"),
    ],
)
def test_a_calls_kind_comes_from_its_tool_and_arguments(name, arguments, kind):
    assert action_kind(name, arguments) == kind


def test_the_default_tools_are_bash_the_editor_and_submit_as_openai_functions():
    tools = default_tools()
    assert [tool["function"]["name"] for tool in tools] == ["bash", "str_replace_editor", "submit"]
    assert tools[1]["function"]["parameters"]["properties"]["command"]["enum"] == [
        "view",
        "create",
        "str_replace",
        "insert",
        "undo_edit",
    ]
    tools[0]["function"]["name"] = "changed"
    assert default_tools()[0]["function"]["name"] == "bash"


def test_a_call_under_an_unknown_harness_is_refused_by_name_before_the_sandbox_is_touched():
    with pytest.raises(UnknownNameError, match="unknown harness 'persisten'; did you mean 'persistent'"):
        execute_call(None, "bash", {"command": "true"}, harness="persisten")
