"""The host's walks of a sandbox's tree are bounded (audit F3, F5): one open per directory and no
deeper than MAX_DEPTH, however deep a chain of directories a command builds; each entry costs the
disk limit at least a block, so inodes are limited too; a directory is read only as far as the
entry limit allows; and a manifest of an ordinary tree is what it always was."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import pivot_envs.sandboxes.manifest as manifest_module
from pivot_envs.sandboxes import SandboxLimits
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
from pivot_envs.sandboxes.manifest import ENTRY_BYTES, MAX_DEPTH, disk_usage, manifest

GB = 1 << 30


def make_chain(root, depth: int) -> None:
    """`root`/d/d/d/... `depth` directories deep, made from descriptors (its path is longer than PATH_MAX)."""
    top = current = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=current)
        following = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
        if current != top:
            os.close(current)
        current = following
    os.close(current)
    if current != top:
        os.close(top)


@pytest.fixture
def scratch(tmp_path):
    """A directory for a big tree: in /dev/shm where there is one (making inodes there is quick),
    removed with `rm -rf` (shutil.rmtree recurses once per level: a deep chain breaks it)."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else tmp_path
    path = Path(tempfile.mkdtemp(prefix="walk-bounds-", dir=base))
    yield path
    subprocess.run(["rm", "-rf", "--", str(path)], check=True)


def counted_opens(monkeypatch) -> list[int]:
    opens = [0]
    real = os.open

    def spy(*args, **kwargs):
        opens[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    return opens


def make_empty_files(directory, count: int) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for index in range(count):
            os.close(os.open(f"f{index}", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=descriptor))
    finally:
        os.close(descriptor)


def over_the_limit(path, most_entries: int, reason: str) -> None:
    """The disk check of `path` says it is over any limit, for `reason` (the work it did is counted by the
    caller: opens or listings, not time)."""
    used = disk_usage(path, stop_above=GB, most_entries=most_entries)
    assert used > GB and used.over == reason


def test_a_3000_deep_chain_costs_a_manifest_one_open_per_directory_and_no_more_than_max_depth(
    scratch, monkeypatch
):
    make_chain(scratch, 3000)
    opens = counted_opens(monkeypatch)
    files = manifest(scratch)
    assert opens[0] <= MAX_DEPTH + 2
    # the chain down to MAX_DEPTH components, nothing deeper
    assert list(files) == [".", *("/".join(["d"] * depth) for depth in range(1, MAX_DEPTH + 1))]
    assert set(files.values()) - {files["."]} <= {files["d"]} and files["d"].startswith("d ")


def test_a_walk_left_deep_down_leaves_no_descriptor_open(scratch):
    make_chain(scratch, 3000)
    held = len(os.listdir("/proc/self/fd"))
    top = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    walk = manifest_module._entries(top, None)
    for path, _, _ in walk:
        if path.count("/") == MAX_DEPTH // 2:
            assert len(os.listdir("/proc/self/fd")) <= held + 1 + MAX_DEPTH // 2 + 1
            break
    walk.close()
    os.close(top)
    assert len(os.listdir("/proc/self/fd")) == held


def test_a_3000_deep_chain_is_over_any_disk_limit_and_its_check_is_quick(scratch, monkeypatch):
    make_chain(scratch, 3000)
    opens = counted_opens(monkeypatch)
    over_the_limit(scratch, 100_000, "depth")
    assert opens[0] <= MAX_DEPTH + 3
    # a chain within MAX_DEPTH is counted as it is
    shallow = scratch / "shallow"
    shallow.mkdir()
    make_chain(shallow, MAX_DEPTH - 1)
    used = disk_usage(shallow, stop_above=GB, most_entries=100_000)
    assert used.over == "" and MAX_DEPTH * ENTRY_BYTES > used >= (MAX_DEPTH - 1) * ENTRY_BYTES


def test_the_manifest_of_an_ordinary_tree_is_unchanged(tmp_path):
    tree = tmp_path / "tree"
    for directory in ("a/c", "b/p", ".git"):
        (tree / directory).mkdir(parents=True)
    (tree / "top.txt").write_text("top\n")
    (tree / "a" / "c" / "deep.txt").write_text("deep\n")
    os.symlink("../b/y.txt", tree / "a" / "link")
    (tree / "b" / "y.txt").write_text("")
    os.mkfifo(tree / "b" / "p" / "fifo")
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    for path in ("a", "a/c", "b", "b/p"):
        (tree / path).chmod(0o755)
    for path in ("top.txt", "a/c/deep.txt", "b/p/fifo"):
        (tree / path).chmod(0o644)
    (tree / "b" / "y.txt").chmod(0o600)
    tree.chmod(0o755)
    files = manifest(tree)
    # each directory's subdirectories (sorted), then its other entries, then each subdirectory's tree
    assert list(files.items()) == [
        (".", "d 755"),  # the tree's own entry first
        ("a", "d 755"),
        ("b", "d 755"),
        ("top.txt", "f 644 facdca2fa68795a4937fd54f654c3f9d"),
        ("a/c", "d 755"),
        ("a/link", "l 777 -> ../b/y.txt"),
        ("a/c/deep.txt", "f 644 1b385affd7adb5a6283fef292b5df0f7"),
        ("b/p", "d 755"),
        ("b/y.txt", "f 600 d41d8cd98f00b204e9800998ecf8427e"),
        ("b/p/fifo", "p 644"),
    ]
    assert list(manifest(tree, limit=4)) == [".", "a", "b", "top.txt", "a/c"]  # "." beyond the limit


def test_a_writable_layer_flooded_outside_the_roots_is_walked_a_bounded_way_and_listed(scratch, monkeypatch):
    """Docker's `system_writes` walks the container's writable layer outside the writable roots: 20,000
    directories there (which it never lists) were all walked; the walk stops at OUTSIDE_ENTRIES and the
    flood is itself reported as a write outside."""
    (scratch / "app").mkdir()
    make_empty_files(scratch / "app", 100)  # inside a root: not walked
    (scratch / "var").mkdir()
    descriptor = os.open(scratch / "var", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for index in range(20_000):
            os.mkdir(f"d{index}", dir_fd=descriptor)
    finally:
        os.close(descriptor)
    (scratch / "zz").mkdir()
    (scratch / "zz" / "evil").write_text("")
    counts = counted_listings(monkeypatch)
    found = manifest_module.writes_outside(scratch, ["/app"], most_entries=5000)
    assert found == ["/[more than 5000 entries outside the writable roots]"]
    assert counts["stat"] <= 5001  # (a listing is read up to manifest.LISTED entries; only these are stat'ed)
    # under the bound the file is listed, as before
    assert manifest_module.writes_outside(scratch, ["/app"], most_entries=30_000) == ["/zz/evil"]


def test_something_in_a_roots_own_place_is_a_write_to_the_root_not_outside(scratch):
    """The walk skips the roots' directories only; a root replaced by a file (or a removed root's
    whiteout) is a write to the root itself, which `writes_outside` does not list; a file beside it is."""
    (scratch / "app").write_text("the root /app, replaced by a file")
    (scratch / "etc").mkdir()
    (scratch / "etc" / "passwd").write_text("")
    assert manifest_module.writes_outside(scratch, ["/app"]) == ["/etc/passwd"]


def test_empty_files_cost_the_disk_limit_a_block_each(scratch):
    make_empty_files(scratch, 200_000)
    assert disk_usage(scratch) >= 200_000 * ENTRY_BYTES


class CountedEntry:
    """A listing's entry that counts its lstat calls."""

    def __init__(self, entry, counts):
        self.entry, self.counts, self.name = entry, counts, entry.name

    def is_dir(self, *, follow_symlinks=True):
        return self.entry.is_dir(follow_symlinks=follow_symlinks)

    def stat(self, *, follow_symlinks=True):
        self.counts["stat"] += 1
        return self.entry.stat(follow_symlinks=follow_symlinks)


def counted_listings(monkeypatch) -> dict[str, int]:
    counts = {"read": 0, "stat": 0}
    real = os.scandir

    class Counted:
        def __init__(self, path):
            self.listing = real(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.listing.close()
            return False

        def __iter__(self):
            for entry in self.listing:
                counts["read"] += 1
                yield CountedEntry(entry, counts)

    monkeypatch.setattr(os, "scandir", Counted)
    return counts


def test_a_tree_past_its_entry_limit_is_over_the_disk_limit_and_read_no_further(scratch, monkeypatch):
    make_empty_files(scratch, 5000)
    counts = counted_listings(monkeypatch)
    over_the_limit(scratch, 1000, "entries")
    assert counts["stat"] <= 1001
    # a directory bigger than LISTED is not even read past what the limit allows
    monkeypatch.setattr(manifest_module, "LISTED", 100)
    counts.update(read=0, stat=0)
    over_the_limit(scratch, 1000, "entries")
    assert counts["read"] <= 1001 and counts["stat"] <= 1001
    # 300 entries and the tree's own ("."), which the limit does not count
    assert len(manifest(scratch, limit=300)) == 300 + 1 and counts["read"] <= 1001 + 300
    # within the limit, the same tree is counted in full
    assert disk_usage(scratch, stop_above=GB, most_entries=5000) == 5000 * ENTRY_BYTES


def test_a_directory_swapped_between_its_listing_and_its_opening_is_not_walked(tmp_path, monkeypatch):
    host = tmp_path / "host"
    host.mkdir()
    (host / "host-only-secret").write_text("secret")
    tree = tmp_path / "tree"
    for name in ("link", "other"):
        (tree / name).mkdir(parents=True)
        (tree / name / "mine").write_text("mine")
    (tree / "elsewhere").mkdir()
    (tree / "elsewhere" / "not-listed-there").write_text("x")
    real, swapped = os.open, []

    def swapping_open(path, flags, mode=0o777, *, dir_fd=None):
        # Listed as directories, `link` becomes a link to a host directory and `other` another directory.
        if dir_fd is not None and path in ("link", "other") and path not in swapped:
            swapped.append(path)
            os.rename(tree / path, tmp_path / f"{path}-old")
            if path == "link":
                os.symlink(host, tree / "link")
            else:
                os.rename(tree / "elsewhere", tree / "other")
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", swapping_open)
    files = manifest(tree)
    assert sorted(swapped) == ["link", "other"]
    assert not any(path.startswith(("link/", "other/")) for path in files), files


@pytest.fixture
def bwrap_backend(has_bwrap):
    backend = BwrapBackend(has_bwrap, SandboxLimits(timeout=3.0, entries=20_000), warm_pool=0)
    yield backend
    backend.close()


DEEP = "nested its directories deeper"
CHAIN = "python3 -c \"import os\nfor _ in range(3000): os.mkdir('d'); os.chdir('d')\nprint('made')\"; sleep 1"
FILES = (
    'mkdir many && cd many && python3 -c "import os\nfor i in range(150000): '
    "os.close(os.open('f%d' % i, os.O_CREAT | os.O_WRONLY, 0o644))\nprint('all made')\""
)


def test_a_sandbox_that_builds_a_3000_deep_chain_keeps_to_its_time_limits(bwrap_backend):
    sandbox = bwrap_backend.new_sandbox("/app")
    start = time.monotonic()
    result = sandbox.run(CHAIN, files=True)
    assert time.monotonic() - start < 3.0 + 2.0
    assert result.exit_code == 137 and DEEP in result.output, result.output
    start = time.monotonic()
    result = sandbox.run("true", files=True)
    assert time.monotonic() - start < 3.0 + 2.0
    # while the chain is there, a command is refused or killed at its first disk check (0.1 s)
    assert result.exit_code == 0 or DEEP in result.output, result.output
    assert len(result.files) == MAX_DEPTH + 1  # and the workspace's own entry


def test_a_sandbox_past_its_entry_limit_is_killed_naming_the_limit(bwrap_backend):
    sandbox = bwrap_backend.new_sandbox("/app")
    start = time.monotonic()
    # making inodes on a busy host's disk is slow (a few thousand a second): the limit is met within seconds
    result = sandbox.run(FILES, timeout=20.0, files=True)
    assert time.monotonic() - start < 20.0 + 2.0
    assert result.exit_code == 137 and not result.timed_out, result.output
    assert "entry limit (20000)" in result.output and "all made" not in result.output, result.output
    # the sandbox still answers (while the files are there, a command is refused or killed at a disk check)
    after = sandbox.run("true")
    assert after.exit_code == 0 or "entry limit (20000)" in after.output, after.output


def test_what_a_git_directory_holds_counts_against_the_disk_limit(tmp_path):
    """The manifest leaves .git out (its objects differ between equivalent commands); the disk check must not:
    50 MB written under x/.git counted as 4 KiB."""
    blob = tmp_path / "x" / ".git" / "blob"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"\1" * (8 << 20))
    assert disk_usage(tmp_path) >= 8 << 20
