"""Trees a command left that are deeper than Python recurses: the host removes them with `rm -rf` (shutil.rmtree
recursed once per level and raised RecursionError past about a thousand), so the sandbox answers its next
command, and closing or cleaning up never raises. Every sandbox test runs on both backends.

Inside a sandbox a command is killed once a disk check (every 0.1 s) sees its directories nest deeper than
the host counts them (manifest.MAX_DEPTH), at about 150 levels here, so the end-to-end test below mostly
shows the kill and the removal of what was left; the depths past Python's recursion, which a faster command could reach before the host
looks, are tested on the host's removal itself (the last two tests)."""

from __future__ import annotations

import os

from pivot_envs.sandboxes.cleanup import remove_tree
from pivot_envs.sandboxes.runner import clear_output

# One `mkdir -p` of a 1,100-level path, at the output path the runner writes.
DEEP_OUTPUT = (
    "rm -f /.pivot/out; mkdir /.pivot/out; cd /.pivot/out && mkdir -p $(printf 'd/%.0s' $(seq 1100))"
)


def test_an_output_path_replaced_by_a_deep_chain_is_killed_and_removed(sandbox):
    """The command is killed when a disk check sees its chain past the depth the host counts (or ends first,
    on a quick machine, with the whole chain made); the runner removes whatever is at the output path before
    the next command, so the sandbox answers (a sandbox left deeper than the host counts runs nothing more)."""
    first = sandbox.run(DEEP_OUTPUT)
    assert "not a file" in first.output
    assert first.exit_code == 0 or "deeper than the host counts" in first.output, first.output
    for _ in range(2):
        assert sandbox.run("echo next").output == "next\n"


def _chain(top, depth: int) -> None:
    """`top`, holding `depth` nested directories (built relative to a descriptor: the full path is longer than
    PATH_MAX)."""
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def test_the_runner_removes_an_output_directory_of_any_depth(tmp_path):
    """What the runner does before each command, on a tree a fast command could leave before any check of the
    host sees it (here 3,000 deep)."""
    (tmp_path / "state").mkdir()
    _chain(tmp_path / "state" / "out", 3000)
    clear_output(tmp_path, "state")
    assert not (tmp_path / "state" / "out").exists()


def test_remove_tree_removes_any_depth_and_never_raises(tmp_path):
    top = tmp_path / "deep"
    _chain(top, 3000)
    remove_tree(top)
    assert not top.exists()
    remove_tree(top)  # already gone: nothing to do, nothing raised
