"""`git_state` (sandboxes/gitstate.py): a workspace's HEAD, refs and index entries read from the host, as
git itself lists them, the same for equivalent commands, bounded, and never through a link."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from pivot_envs.sandboxes import gitstate
from pivot_envs.sandboxes.gitstate import git_state, index_entries

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git on the host")

FIXED = {
    "GIT_AUTHOR_NAME": "p",
    "GIT_AUTHOR_EMAIL": "p@example.com",
    "GIT_COMMITTER_NAME": "p",
    "GIT_COMMITTER_EMAIL": "p@example.com",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    "HOME": "/nonexistent",
}


def git(repo, *args):
    env = {**os.environ, **FIXED}
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout


def repo(path, version=2, add="-A"):
    path.mkdir()
    (path / "a" / "b").mkdir(parents=True)
    (path / "a" / "b" / "one.txt").write_text("x\n")
    (path / "a" / "b" / "name with\ttab and spaces.txt").write_text("z")
    (path / "two").write_text("y\n")
    git(path, "init", "-q")
    git(path, "config", "index.version", str(version))
    git(path, "add", add)
    git(path, "commit", "-q", "-m", "init")
    return path


@pytest.mark.parametrize("version", [2, 3, 4])
def test_the_index_entries_are_gits_own_listing(tmp_path, version):
    path = repo(tmp_path / "r", version)
    (path / "new").write_text("n\n")
    git(path, "add", "-N", "new")  # an intent-to-add entry: extended flags (version 3 and up)
    listed = git(path, "ls-files", "-s", "-z").split("\0")
    expected = [(line.split("\t", 1)[1], line.split("\t", 1)[0]) for line in listed if line]
    assert index_entries((path / ".git" / "index").read_bytes()) == expected


def test_the_state_is_head_the_refs_and_the_index(tmp_path):
    path = repo(tmp_path / "r")
    git(path, "branch", "feature")
    state = git_state(tmp_path, "r").splitlines()
    head = git(path, "rev-parse", "HEAD").strip()
    assert state[:3] == [
        '"" HEAD\t"ref: refs/heads/master"',
        f'"" ref "refs/heads/feature"\t"{head}"',
        f'"" ref "refs/heads/master"\t"{head}"',
    ]
    assert [line.split("\t")[0] for line in state[3:]] == [
        '"" index "a/b/name with\\ttab and spaces.txt"',  # JSON-quoted: a name cannot forge a line
        '"" index "a/b/one.txt"',
        '"" index "two"',
    ]
    git(path, "pack-refs", "--all")  # packed refs read as loose ones
    assert git_state(tmp_path, "r").splitlines() == state


def test_repositories_in_the_listed_directories_are_read_each_under_its_directory(tmp_path):
    workspace = tmp_path / "w"
    workspace.mkdir()
    repo(workspace / "site")
    (workspace / "other").mkdir()
    state = git_state(tmp_path, "w", ["other", "site", "site/a"])
    assert state.splitlines()[0] == '"site" HEAD\t"ref: refs/heads/master"'
    assert all(line.startswith('"site" ') for line in state.splitlines())
    assert git_state(tmp_path, "w", ["other"]) == ""  # a directory not listed is not looked in


def test_repositories_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(gitstate, "REPOSITORIES", 2)
    workspace = tmp_path / "w"
    workspace.mkdir()
    for name in "abc":
        (workspace / name / ".git").mkdir(parents=True)
        (workspace / name / ".git" / "HEAD").write_text(f"ref: refs/heads/{name}\n")
    lines = git_state(tmp_path, "w", ["a", "b", "c"]).splitlines()
    assert lines == [
        '"a" HEAD\t"ref: refs/heads/a"',
        '"b" HEAD\t"ref: refs/heads/b"',
        "repositories\tmore than 2: the rest not read",
    ]


def test_equivalent_commands_leave_the_same_state_and_stat_data_is_left_out(tmp_path):
    repo(tmp_path / "one", add="-A")
    second = repo(tmp_path / "two", add=".")
    time.sleep(0.01)
    (second / "two").touch()  # new mtimes in the index after a refresh
    git(second, "update-index", "--refresh")
    assert git_state(tmp_path, "one") == git_state(tmp_path, "two")


def test_no_repository_is_empty_and_a_missing_workspace_is_none(tmp_path):
    (tmp_path / "w").mkdir()
    assert git_state(tmp_path, "w") == ""
    assert git_state(tmp_path, "gone") is None


def test_links_are_never_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("ref: refs/heads/stolen\n")
    path = repo(tmp_path / "r")
    (path / ".git" / "HEAD").unlink()
    (path / ".git" / "HEAD").symlink_to(secret)
    (path / ".git" / "refs" / "heads" / "master").unlink()
    (path / ".git" / "refs" / "heads" / "master").symlink_to(secret)
    (path / ".git" / "index").unlink()
    (path / ".git" / "index").symlink_to(secret)
    state = git_state(tmp_path, "r")
    assert state == ""  # HEAD, the one ref and the index are links: none is read
    linked = tmp_path / "l"
    linked.mkdir()
    (linked / ".git").symlink_to(path / ".git")
    assert git_state(tmp_path, "l") == ""  # a .git that is a link is not a repository read


def test_a_huge_or_forged_index_is_one_bounded_entry(tmp_path):
    path = repo(tmp_path / "r")
    index = path / ".git" / "index"
    index.write_bytes(b"DIRC" + (2).to_bytes(4, "big") + (10**9).to_bytes(4, "big") + os.urandom(4096))
    (line,) = [line for line in git_state(tmp_path, "r").splitlines() if line.startswith('"" index')]
    assert line.startswith('"" index\tnot parsed (4108 bytes), digest ')
    with open(index, "wb") as handle:
        handle.truncate(gitstate.INDEX_BYTES + 1)  # sparse: nothing of it is read
    start = time.perf_counter()
    (line,) = [line for line in git_state(tmp_path, "r").splitlines() if line.startswith('"" index')]
    left = gitstate.INDEX_BYTES
    assert line == f'"" index\t{left + 1} bytes, over the {left} left to read: not read'
    assert time.perf_counter() - start < 1.0


def test_refs_are_bounded(tmp_path):
    path = repo(tmp_path / "r")
    head = git(path, "rev-parse", "HEAD").strip()
    tags = path / ".git" / "refs" / "tags"
    for number in range(gitstate.REFS + 50):
        (tags / f"t{number}").write_text(head + "\n")
    refs = [line for line in git_state(tmp_path, "r").splitlines() if line.startswith('"" ref ')]
    assert gitstate.REFS - 5 <= len(refs) <= gitstate.REFS  # the directories listed count too


def test_a_workspace_of_hostile_repositories_costs_its_bounds_not_more(tmp_path, monkeypatch):
    # many repositories, each with as many refs and as large an index as one may have: the refs and index
    # bytes are one budget over all of them
    monkeypatch.setattr(gitstate, "REFS", 300)
    monkeypatch.setattr(gitstate, "INDEX_BYTES", 3 << 20)
    workspace = tmp_path / "w"
    workspace.mkdir()
    names = [f"r{number}" for number in range(gitstate.REPOSITORIES + 4)]
    for name in names:
        refs = workspace / name / ".git" / "refs" / "tags"
        refs.mkdir(parents=True)
        for number in range(100):
            (refs / f"t{number}").write_text("0" * 40 + "\n")
        (workspace / name / ".git" / "index").write_bytes(b"DIRC" + os.urandom((1 << 20) - 4))
    start = time.perf_counter()
    lines = git_state(tmp_path, "w", names).splitlines()
    assert time.perf_counter() - start < 2.0
    assert 300 - 3 * gitstate.REPOSITORIES <= sum(" ref " in line for line in lines) <= 300
    assert sum("not parsed (1048576 bytes)" in line for line in lines) == 3  # 3 MiB of index read in all
    assert sum("left to read: not read" in line for line in lines) == gitstate.REPOSITORIES - 3
    assert lines[-1] == f"repositories\tmore than {gitstate.REPOSITORIES}: the rest not read"


def test_nested_ref_directories_cost_the_ref_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(gitstate, "REFS", 50)
    path = repo(tmp_path / "r")
    deep = path / ".git" / "refs" / "tags"
    for number in range(200):  # directories, not refs: each listed entry counts
        (deep / f"d{number}" / "x").mkdir(parents=True)
    start = time.perf_counter()
    state = git_state(tmp_path, "r")
    assert time.perf_counter() - start < 1.0
    assert sum(line.startswith('"" ref ') for line in state.splitlines()) <= 50


def _v4_index(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A version-4 index of (strip number's bytes, path suffix) entries, stat data and object ids zero."""
    header = bytes(24) + (0o100644).to_bytes(4, "big") + bytes(12) + b"\x11" * 20
    body = [b"DIRC", (4).to_bytes(4, "big"), len(entries).to_bytes(4, "big")]
    for strip, suffix in entries:
        body.append(header + min(len(suffix), 0xFFF).to_bytes(2, "big") + strip + suffix + b"\0")
    return b"".join(body)


def test_a_version_4_index_whose_paths_outgrow_it_is_not_parsed_and_costs_no_memory():
    """Each entry of a version-4 index may keep the whole previous path and add a byte: a 0.4 MB index once
    made the host hold 5,000 paths of 80 KB (1.2 GB; an 8 MiB one, 38 GiB). A path longer than git's 4,096
    bytes, or more than INDEX_PATH_BYTES of paths in all, makes it one digest entry instead."""
    import tracemalloc

    growing = _v4_index([(b"\0", b"a" * 80_000)] + [(b"\0", b"b")] * 4999)
    at_the_cap = _v4_index([(b"\0", b"a" * 4096)] + [(b"\x01", b"b")] * 4999)  # 20 MB of 4 KB paths
    tracemalloc.start()
    try:
        assert index_entries(growing) is None
        assert index_entries(at_the_cap) is None
        assert tracemalloc.get_traced_memory()[1] < 3 * gitstate.INDEX_PATH_BYTES
    finally:
        tracemalloc.stop()
    fine = _v4_index([(b"\0", b"dir/one")] + [(b"\x03", b"two")] * 10)
    assert index_entries(fine)[:2] == [
        ("dir/one", "100644 " + "11" * 20 + " 0"),
        ("dir/two", "100644 " + "11" * 20 + " 0"),
    ]


def test_an_endless_strip_number_in_a_version_4_index_costs_linear_time():
    """The strip number is a varint: 200 kB of continuation bytes once took the host 6.6 s of CPU after the
    command had ended (quadratic: about 3 h for an 8 MiB index). It is refused as soon as it exceeds the
    previous path."""
    endless = _v4_index([(b"\0", b"a"), (b"\xff" * 8_000_000 + b"\x00", b"b")])
    start = time.perf_counter()
    assert index_entries(endless) is None
    assert time.perf_counter() - start < 0.5


# The objects HEAD, the refs and the index name: present and sound, or one line that says what is not.


def objects_line(tmp_path, name="r"):
    lines = [line for line in git_state(tmp_path, name).splitlines() if line.startswith('"" objects\t')]
    return lines[0].split("\t", 1)[1] if lines else None


def loose(path):
    """{object id: its loose file} of the repository at `path`."""
    objects = path / ".git" / "objects"
    return {f"{d.name}{f.name}": f for d in objects.glob("??") for f in d.iterdir()}


def overwrite(file, data):
    file.chmod(0o644)
    file.write_bytes(data)


def test_an_intact_repository_has_no_objects_line(tmp_path):
    path = repo(tmp_path / "r")
    assert objects_line(tmp_path) is None
    assert len(loose(path)) == 7  # 3 blobs, 3 trees, 1 commit: all loose


def test_deleted_objects_read_as_missing(tmp_path):
    path = repo(tmp_path / "r")
    intact = git_state(tmp_path, "r")
    for file in loose(path).values():
        file.unlink()
    # the commit HEAD's ref names and the 3 index blobs (the commit's tree is read from the commit, gone too)
    assert objects_line(tmp_path) == "4 missing"
    assert git_state(tmp_path, "r") == intact + '\n"" objects\t4 missing'


def test_an_object_overwritten_with_garbage_reads_as_corrupt(tmp_path):
    path = repo(tmp_path / "r")
    blob = git(path, "rev-parse", "HEAD:two").strip()
    overwrite(loose(path)[blob], os.urandom(100))
    assert objects_line(tmp_path) == "1 corrupt"
    overwrite(loose(path)[blob], b"")
    assert objects_line(tmp_path) == "1 corrupt"


def test_an_object_replaced_by_another_valid_objects_file_reads_as_corrupt(tmp_path):
    """A sound zlib stream, a sound header, the right type: only its SHA-1 tells it is another object."""
    path = repo(tmp_path / "r")
    objects = loose(path)
    one, two = git(path, "rev-parse", "HEAD:a/b/one.txt").strip(), git(path, "rev-parse", "HEAD:two").strip()
    overwrite(objects[two], objects[one].read_bytes())
    assert objects_line(tmp_path) == "1 corrupt"
    tree = git(path, "rev-parse", "HEAD^{tree}").strip()  # the commit's tree: one level is checked too
    overwrite(objects[two], objects[one].read_bytes())
    overwrite(objects[tree], objects[git(path, "rev-parse", "HEAD:a").strip()].read_bytes())
    assert objects_line(tmp_path) == "2 corrupt"


def test_a_packed_repository_reads_as_intact_and_as_its_loose_self(tmp_path):
    """`git gc` packs the objects and the refs: the state is the same text, so a sample that packs is not
    refused for it."""
    path = repo(tmp_path / "r")
    git(path, "branch", "feature")
    git(path, "tag", "-a", "-m", "t", "v1")  # a tag object: packed-refs holds a peeled line too
    loose_state = git_state(tmp_path, "r")
    git(path, "gc", "-q")
    assert loose(path) == {}
    assert git_state(tmp_path, "r") == loose_state
    assert objects_line(tmp_path) is None
    (pack,) = (path / ".git" / "objects" / "pack").glob("*.pack")
    pack.unlink()  # the idx alone: its objects are gone
    assert objects_line(tmp_path) == "5 missing"  # the commit, the tag, the 3 blobs


def test_a_pack_overwritten_with_garbage_reads_as_missing(tmp_path):
    path = repo(tmp_path / "r")
    git(path, "gc", "-q")
    (pack,) = (path / ".git" / "objects" / "pack").glob("*.pack")
    overwrite(pack, os.urandom(pack.stat().st_size))
    assert objects_line(tmp_path) == "4 missing"


def test_garbage_idx_links_directories_and_huge_files_do_not_raise(tmp_path):
    path = repo(tmp_path / "r")
    git(path, "gc", "-q")
    packs = path / ".git" / "objects" / "pack"
    (idx,) = packs.glob("*.idx")
    data = idx.read_bytes()
    for garbage in (
        os.urandom(len(data)),
        data[:8] + b"\xff" * 1024 + data[1032:],  # every fanout entry 2**32 - 1: far past the file
        data[:8] + bytes(reversed(data[8:1032])) + data[1032:],  # a fanout that decreases
        data[:-50],
        b"",
    ):
        overwrite(idx, garbage)
        assert objects_line(tmp_path) == "4 missing"
    idx.unlink()
    idx.mkdir()  # a directory where a file is expected
    assert objects_line(tmp_path) == "4 missing"
    idx.rmdir()
    idx.symlink_to(tmp_path / "elsewhere.idx")
    (tmp_path / "elsewhere.idx").write_bytes(data)
    assert objects_line(tmp_path) == "4 missing"  # an idx that is a link is not read
    second = repo(tmp_path / "s")
    objects = loose(second)
    blob = git(second, "rev-parse", "HEAD:two").strip()
    objects[blob].unlink()
    objects[blob].mkdir()
    assert objects_line(tmp_path, "s") == "1 corrupt"
    objects[blob].rmdir()
    objects[blob].symlink_to(objects[git(second, "rev-parse", "HEAD:a/b/one.txt").strip()])
    assert objects_line(tmp_path, "s") == "1 corrupt"  # a link is not followed
    objects[blob].unlink()
    with open(objects[blob], "wb") as handle:
        handle.truncate(10 << 30)  # sparse, 10 GiB of zeros: not a zlib stream, found in its first bytes
    start = time.perf_counter()
    assert objects_line(tmp_path, "s") == "1 corrupt"
    assert time.perf_counter() - start < 1.0


def test_an_inflating_bomb_costs_the_byte_budget_and_reads_as_unchecked(tmp_path, monkeypatch):
    import zlib

    monkeypatch.setattr(gitstate, "OBJECT_BYTES", 4 << 20)
    path = repo(tmp_path / "r")
    blob = git(path, "rev-parse", "HEAD:two").strip()
    size = 1 << 30  # a 1 GiB blob in about 1 MB: its header is sound, its hash too costly to check
    body = zlib.compressobj(9)
    bomb = body.compress(f"blob {size}\0".encode()) + b"".join(
        body.compress(bytes(1 << 20)) for _ in range(1024)
    )
    overwrite(loose(path)[blob], bomb + body.flush())
    start = time.perf_counter()
    assert objects_line(tmp_path) == "1 unchecked"
    assert time.perf_counter() - start < 1.0
    overwrite(loose(path)[blob], zlib.compress(b"blob x\0"))  # a header that does not parse
    assert objects_line(tmp_path) == "1 corrupt"


def test_objects_past_the_object_budget_read_as_unchecked(tmp_path, monkeypatch):
    monkeypatch.setattr(gitstate, "OBJECTS", 2)
    repo(tmp_path / "r")
    assert objects_line(tmp_path) == "3 unchecked"  # the commit and one blob checked; 2 blobs, the tree not


def test_objects_reached_only_through_alternates_read_as_missing(tmp_path):
    source = repo(tmp_path / "source")
    git(tmp_path, "clone", "-q", "--shared", str(source), "clone")
    assert (tmp_path / "clone" / ".git" / "objects" / "info" / "alternates").exists()
    assert objects_line(tmp_path, "clone") == "4 missing"  # alternates are not followed
    assert objects_line(tmp_path, "source") is None


def test_a_gitlink_and_the_empty_blob_are_not_looked_up(tmp_path):
    path = repo(tmp_path / "r")
    (path / "empty").write_text("")
    git(path, "add", "empty")
    for file in loose(path).values():
        if file.parent.name + file.name == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391":
            file.unlink()  # git knows the empty blob without its file
    git(path, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},sub")  # another repository's commit
    assert objects_line(tmp_path) is None
