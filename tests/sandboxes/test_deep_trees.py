"""Trees a command left that are deeper than Python recurses: the host removes them with `rm -rf` (shutil.rmtree
recursed once per level and raised RecursionError past about a thousand), so the sandbox answers its next
command, and closing or cleaning up never raises. Every sandbox test runs on both backends."""

from __future__ import annotations

import os

from pivot_envs.sandboxes.cleanup import remove_tree
from pivot_envs.sandboxes.runner import clear_output

# One mkdir of a 2,200-character path: the chain exists before any check of the host can stop the command.
DEEP_OUTPUT = (
    "rm -f /.pivot/out; mkdir /.pivot/out; cd /.pivot/out && mkdir -p $(printf 'd/%.0s' $(seq 1100))"
)


def test_an_output_path_replaced_by_a_directory_deeper_than_python_recurses_is_removed(sandbox):
    """The runner removes whatever is at the output path before the next command; a 1,100-deep chain there
    made every later command of the sandbox raise RecursionError."""
    first = sandbox.run(DEEP_OUTPUT)
    assert "not a file" in first.output
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
