"""The manifest's digest reuse (manifest.KnownDigests): a fork's workspace manifest reads only the
files its commands changed, and a change never hides behind an unchanged size, mtime and inode."""

from __future__ import annotations

import os
import shutil
import time

import pivot_envs.sandboxes.manifest as manifest_module
from pivot_envs.sandboxes.manifest import KnownDigests, file_digests, manifest

# Longer than any filesystem timestamp tick: files older than this are not racy.
TICK = 0.05


def make_tree(root):
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (root / "README").write_text("readme")
    os.symlink("README", root / "link")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")


def forked(tmp_path, seal=True):
    """A snapshot tree hashed once, its copy (mtimes kept) and the copy's KnownDigests, sealed after a tick."""
    snapshot, fork = tmp_path / "snapshot", tmp_path / "fork"
    make_tree(snapshot)
    digests = file_digests(snapshot)
    shutil.copytree(snapshot, fork, symlinks=True)
    known = KnownDigests.of_copy(fork, digests)
    time.sleep(TICK)
    if seal:
        known.seal(tmp_path / "stamp")
    return fork, known


def counted_reads(monkeypatch):
    reads = []
    real = manifest_module._digest

    def spy(directory, name, *rest):
        reads.append(name)
        return real(directory, name, *rest)

    monkeypatch.setattr(manifest_module, "_digest", spy)
    return reads


def test_a_manifest_with_known_digests_is_the_full_manifest_and_reads_no_unchanged_file(
    tmp_path, monkeypatch
):
    fork, known = forked(tmp_path)
    full = manifest(fork)
    reads = counted_reads(monkeypatch)
    assert manifest(fork, known=known) == full
    assert reads == []
    assert set(full) == {".", "pkg", "pkg/mod.py", "README", "link"}


def test_a_file_changed_in_the_fork_is_read_again(tmp_path, monkeypatch):
    fork, known = forked(tmp_path)
    (fork / "pkg" / "mod.py").write_text("def f():\n    return 2\n")
    expected = manifest(fork)
    reads = counted_reads(monkeypatch)
    assert manifest(fork, known=known) == expected
    assert set(reads) == {"mod.py"}


def test_a_same_size_rewrite_with_its_mtime_put_back_is_detected(tmp_path):
    # What a (size, mtime_ns, inode) cache misses: same size, same inode, mtime restored (touch -d).
    fork, known = forked(tmp_path)
    path = fork / "pkg" / "mod.py"
    before, info = manifest(fork, known=known)["pkg/mod.py"], path.stat()
    with open(path, "r+") as handle:  # in place: the inode stays
        handle.write("def g")
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (info.st_ino, info.st_size, info.st_mtime_ns)
    assert manifest(fork, known=known)["pkg/mod.py"] != before


def test_a_record_taken_within_the_stamps_timestamp_tick_is_never_trusted(tmp_path):
    # Racy git: a file written, recorded and rewritten (same size, in place) within one timestamp
    # tick keeps its size, mtime, ctime and inode, so every stat field matches a stale record. (This
    # kernel's multigrain timestamps rarely let that happen for real; the record is made so here.)
    path = tmp_path / "f.txt"
    path.write_text("new!")
    info = path.stat()
    stale = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, "digest-of-old!")
    known = KnownDigests({"f.txt": stale})
    known.stamp_ns = max(info.st_mtime_ns, info.st_ctime_ns)  # the stamp fell in the file's tick
    assert known.digest("f.txt", info) is None
    assert manifest(tmp_path, known=known) == manifest(tmp_path)
    known.stamp_ns += 1  # taken a tick later, the record holds
    assert known.digest("f.txt", info) == "digest-of-old!"


def test_digests_are_not_reused_before_the_stamp_is_taken(tmp_path, monkeypatch):
    fork, known = forked(tmp_path, seal=False)
    reads = counted_reads(monkeypatch)
    manifest(fork, known=known)
    assert sorted(reads) == ["README", "mod.py"]


def test_a_file_renamed_over_another_is_read_again(tmp_path):
    fork, known = forked(tmp_path)
    (fork / "pkg" / "mod.py").write_text("abcdef")  # README's size, a new ctime
    os.replace(fork / "pkg" / "mod.py", fork / "README")
    assert manifest(fork, known=known) == manifest(fork)


def test_the_walk_keeps_os_walks_order_and_the_entry_limit(tmp_path):
    make_tree(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("x")
    (tmp_path / "z").mkdir()
    listed = list(manifest(tmp_path))
    expected = ["."]  # the workspace's own entry first, beyond the limit
    for directory, dirs, names in os.walk(tmp_path):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        expected += [os.path.relpath(os.path.join(directory, n), tmp_path) for n in [*dirs, *names]]
    assert listed == expected
    assert list(manifest(tmp_path, limit=3)) == expected[:4]


def test_a_bubblewrap_fork_reports_a_same_size_rewrite_whose_mtime_a_command_put_back(has_bwrap):
    from sandbox_fixtures import FAST_LIMITS

    from pivot_envs.sandboxes.bwrap_backend import BwrapBackend

    with BwrapBackend(has_bwrap, FAST_LIMITS, warm_pool=1) as backend:
        sandbox = backend.create()
        sandbox.run("mkdir pkg && echo 'def f(): return 1' > pkg/mod.py && echo hi > notes")
        snapshot = sandbox.snapshot()
        sandbox.close()
        backend.wait_warm(snapshot)
        time.sleep(TICK)
        left_alone, rewritten = backend.fork(snapshot), backend.fork(snapshot)
        assert set(left_alone.known.files) == {"pkg/mod.py", "notes"}
        before = left_alone.run("cat notes", files=True).files
        assert before == manifest(left_alone.directory / "work")
        after = rewritten.run(
            "touch -r pkg/mod.py /tmp/t && echo 'def f(): return 2' > pkg/mod.py"
            " && touch -r /tmp/t pkg/mod.py",
            files=True,
        ).files
        assert after["pkg/mod.py"] != before["pkg/mod.py"]
        assert {path: entry for path, entry in after.items() if path != "pkg/mod.py"} == {
            path: entry for path, entry in before.items() if path != "pkg/mod.py"
        }
        left_alone.close()
        rewritten.close()


def test_a_copy_is_read_no_further_than_its_snapshot_was_hashed(tmp_path, monkeypatch):
    """of_copy walks the copy with the entry limit file_digests hashed the snapshot with: 5,000 more files
    cost it nothing, and the files it keeps are the same."""
    snapshot, fork = tmp_path / "snapshot", tmp_path / "fork"
    make_tree(snapshot)
    (snapshot / "zz").mkdir()
    for index in range(5000):
        (snapshot / "zz" / f"f{index}").write_text("")
    digests = file_digests(snapshot, limit=10)
    shutil.copytree(snapshot, fork, symlinks=True)
    listed = []
    real = manifest_module._listed

    def counted(directory, prefix, *rest):
        for entry in real(directory, prefix, *rest):
            listed.append(prefix + entry[0])
            yield entry

    monkeypatch.setattr(manifest_module, "_listed", counted)
    known = KnownDigests.of_copy(fork, digests, limit=10)
    assert len(listed) <= 10
    assert set(known.files) == set(digests) and {"pkg/mod.py", "README"} <= set(known.files)
