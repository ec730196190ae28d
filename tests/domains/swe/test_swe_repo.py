"""The SWE domain's repositories: the bundled more-itertools sdist, RepoSpec files, and the task's
start state made on the host and copied into real sandboxes."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest
from swe_helpers import BUGGY, bug_patch

from pivot_envs.domains.swe.repo import (
    COMMIT_MESSAGE,
    RepoError,
    RepoSpec,
    bundled_repo,
    read_repo_spec,
    resolve_repo,
    start_sandbox,
    start_tree,
    unpack,
)
from pivot_envs.domains.swe.tasks import run_unittest
from pivot_envs.domains.swe.tools import tree_hash


def git(directory, *args):
    return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, check=True).stdout


def test_bundled_repository_base_passes_the_tests_tasks_use(tmp_path):
    repo = bundled_repo()
    unpack(repo, tmp_path)
    assert (tmp_path / "more_itertools" / "more.py").is_file() and (
        tmp_path / "tests" / "test_more.py"
    ).is_file()
    outcomes = run_unittest(
        tmp_path, ["tests.test_more.ChunkedTests", "tests.test_recipes.NthCombinationTests"], repo.env
    )
    assert len(outcomes) >= 8
    assert {o["outcome"] for o in outcomes.values()} == {"pass"}


def test_start_tree_is_one_commit_whose_hash_is_the_same_on_every_build(tmp_path):
    first = start_tree(bundled_repo(), cache=tmp_path / "a")
    second = start_tree(bundled_repo(), cache=tmp_path / "b")
    assert first != second
    assert git(first, "rev-parse", "HEAD") == git(second, "rev-parse", "HEAD")
    assert git(first, "log", "--format=%s").strip() == COMMIT_MESSAGE  # one commit: no history shows the bug
    assert git(first, "status", "--porcelain") == ""
    assert start_tree(bundled_repo(), cache=tmp_path / "a") == first  # cached


def test_start_tree_commits_the_bug_so_git_diff_shows_nothing(calc_repo, tmp_path):
    tree = start_tree(calc_repo, bug_patch(), cache=tmp_path)
    assert (tree / "calc" / "ops.py").read_text() == BUGGY
    assert git(tree, "diff", "HEAD") == ""
    assert start_tree(calc_repo, None, cache=tmp_path) != tree


def test_a_bug_patch_that_does_not_apply_is_a_repo_error(calc_repo, tmp_path):
    patch = bug_patch().replace("return sum(values) / len(values)", "return something_else")
    with pytest.raises(RepoError, match="bug patch for calc does not apply"):
        start_tree(calc_repo, patch, cache=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == []  # no half-built tree left behind


def test_an_archive_member_outside_the_repository_is_refused(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as handle:
        for name in ("pkg/setup.py", "pkg/../../escape.txt"):
            info = tarfile.TarInfo(name)
            info.size = 3
            handle.addfile(info, io.BytesIO(b"abc"))
    spec = RepoSpec(name="evil", archive=str(archive))
    with pytest.raises(RepoError, match="points outside the repository"):
        unpack(spec, tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


def test_repo_spec_file_reads_with_the_archive_relative_to_it(tmp_path):
    (tmp_path / "spec.toml").write_text(
        'name = "calc"\narchive = "src"\nsources = ["calc/ops.py"]\n[env]\nTZ = "UTC"\n'
    )
    spec = read_repo_spec(tmp_path / "spec.toml")
    assert spec.archive == str(tmp_path / "src")
    assert spec.sources == ("calc/ops.py",) and spec.env == {"TZ": "UTC"} and spec.workdir == "/repo"
    assert resolve_repo({"repo": "calc", "repo_spec": spec.to_dict()}) == spec
    assert resolve_repo({"repo": "more-itertools"}) == bundled_repo()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('archive = "x.tar.gz"\n', "field 'name' must be a non-empty string"),
        ('name = "a"\narchive = "x"\nbogus = 1\n', "unknown field"),
        ('name = "a"\narchive = "x"\ntest_command = "pytest"\n', "must contain {tests}"),
        ('name = "a"\narchive = [\n', "cannot read the repository spec"),
    ],
)
def test_a_bad_repo_spec_names_the_file_and_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    with pytest.raises(RepoError, match=message) as error:
        read_repo_spec(path)
    assert str(path) in str(error.value)


def test_a_repository_the_context_does_not_describe_is_a_repo_error():
    with pytest.raises(RepoError, match="'mylib' is not bundled"):
        resolve_repo({"repo": "mylib"})


def test_start_sandbox_holds_the_same_tree_on_both_backends_with_the_pinned_environment(backend, calc_repo):
    sandbox = start_sandbox(backend, calc_repo, bug_patch())
    try:
        assert (
            sandbox.run("git status --porcelain; echo TZ=$TZ PYTHONHASHSEED=$PYTHONHASHSEED").output
            == "TZ=UTC PYTHONHASHSEED=0\n"
        )
        assert sandbox.run("python3 -m unittest tests.test_ops.AddTests").ok
        assert not sandbox.run("python3 -m unittest tests.test_ops.MeanTests").ok  # the bug is in
        before = tree_hash(sandbox)
        assert (
            sandbox.run("sed -i 's/(len(values) + 1)/len(values)/' calc/ops.py && git diff --stat").output
            == " calc/ops.py | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)\n"
        )
        assert tree_hash(sandbox) != before
    finally:
        sandbox.close()
    # The hash of the start state does not depend on the backend.
    assert before == git(start_tree(calc_repo, bug_patch()), "write-tree").strip()
