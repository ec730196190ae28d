"""A sandbox's workspace read from the host: its manifest of files (type, mode, content digest) and
the disk it uses, never following a link a command planted out of the sandbox's tree."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def inside(path: str | os.PathLike, root: str | os.PathLike | None) -> bool:
    """Whether `path`, with every link resolved on the host, stays inside `root` (True without a root)."""
    if root is None:
        return True
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def disk_usage(root: str | os.PathLike, stop_above: int | None = None) -> int:
    """Bytes allocated under `root` (links not followed); stops counting once above `stop_above`."""
    total, pending = 0, [os.fspath(root)]
    while pending:
        try:
            entries = os.scandir(pending.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
        if stop_above is not None and total > stop_above:
            break
    return total


class KnownDigests:
    """Content digests of a tree's regular files that a later manifest of the tree may reuse (both backends).

    Each file's digest is kept with its stat (inode, size, mtime, ctime); a manifest reuses it
    only while all four are unchanged and both times are older than `stamp_ns`, a filesystem
    timestamp taken once the tree was complete and before anything may write it (`seal`): a file
    rewritten within the same timestamp tick as the stamp keeps all four (the racy-git problem).
    A command cannot set a ctime, so restoring an mtime with `touch -d` does not hide a change.

    bubblewrap: a fork's workspace is a copy of a snapshot's, whose files were hashed once;
    `of_copy` takes each copied file's digest from the snapshot's with the copy's own stat.
    Docker: every fork of a snapshot sees the same files of the image's layers (same inode and
    times, through each container's overlay); `of_tree` hashes them once and each fork gets a
    `fork()` of it with a stamp of its own. A write in a container copies the file up: new ctime.
    """

    def __init__(self, files: dict[str, tuple[int, int, int, int, str]]) -> None:
        self.files = files
        self.stamp_ns: int | None = None

    @classmethod
    def of_copy(cls, root: str | os.PathLike, digests: dict[str, tuple[int, int, str]]) -> KnownDigests:
        """The digests of `root`, a copy (mtimes kept) of a tree whose files `file_digests` hashed."""
        known: dict[str, tuple[int, int, int, int, str]] = {}
        for relative, _, info in _walk(root, None):
            if stat.S_ISREG(info.st_mode):
                size_mtime_digest = digests.get(relative)
                if size_mtime_digest is not None and size_mtime_digest[:2] == (
                    info.st_size,
                    info.st_mtime_ns,
                ):
                    known[relative] = (
                        info.st_ino,
                        info.st_size,
                        info.st_mtime_ns,
                        info.st_ctime_ns,
                        size_mtime_digest[2],
                    )
        return cls(known)

    @classmethod
    def of_tree(cls, root: str | os.PathLike, limit: int = 5000) -> KnownDigests:
        """The digests of the regular files under `root` (.git left out) with their stat, unsealed;
        `root` must not change meanwhile (an image's files seen through a fresh container)."""
        return cls(
            {
                relative: (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, _digest(path))
                for relative, path, info in _walk(root, limit)
                if stat.S_ISREG(info.st_mode)
            }
        )

    def fork(self) -> KnownDigests:
        """The same digests, unsealed, for another tree showing the same files (a fork of the snapshot)."""
        return KnownDigests(self.files)

    def seal(self, stamp: str | os.PathLike) -> None:
        """Take the stamp: create the file `stamp` (on the tree's filesystem, outside the tree) and keep its mtime.

        Call it after the copy is complete and before anything may write the tree.
        """
        descriptor = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            self.stamp_ns = os.fstat(descriptor).st_mtime_ns
        finally:
            os.close(descriptor)

    def digest(self, relative: str, info: os.stat_result) -> str | None:
        """The recorded digest of `relative` when its stat `info` shows it unchanged, else None."""
        entry = self.files.get(relative)
        if entry is None or self.stamp_ns is None:
            return None
        ino, size, mtime_ns, ctime_ns, digest = entry
        if (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns) != (ino, size, mtime_ns, ctime_ns):
            return None
        return digest if max(mtime_ns, ctime_ns) < self.stamp_ns else None


def _walk(root: str | os.PathLike, limit: int | None) -> Iterator[tuple[str, str, os.stat_result]]:
    """(relative path, full path, lstat) of every entry under `root` but .git, top-down: a directory's
    subdirectories (sorted) then its other entries, then each subdirectory's tree (os.walk's order)."""
    base = os.fspath(root)
    pending = [(base, "")]
    count = 0
    while pending:
        directory, prefix = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            continue
        dirs = sorted((e for e in entries if e.name != ".git" and _is_dir(e)), key=lambda e: e.name)
        others = [e for e in entries if not _is_dir(e)]
        for entry in [*dirs, *others]:
            if limit is not None and count >= limit:
                return
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            count += 1
            yield prefix + entry.name, entry.path, info
        # A link to a directory is listed, not walked into.
        pending.extend((e.path, f"{prefix}{e.name}/") for e in reversed(dirs) if not e.is_symlink())


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # os.walk follows a link to a directory in its listing, not into it
    except OSError:
        return False


def manifest(root: str | os.PathLike, limit: int = 5000, known: KnownDigests | None = None) -> dict[str, str]:
    """The workspace manifest from the host side, in the runner's format ({path: "type mode [digest]"}).

    .git is left out: commit objects differ between equivalent commands (timestamps, order).
    `known`: digests of unchanged files to reuse instead of reading them (see KnownDigests).
    """
    entries: dict[str, str] = {}
    for relative, path, info in _walk(root, limit):
        mode = oct(stat.S_IMODE(info.st_mode))[2:]
        if stat.S_ISLNK(info.st_mode):
            entries[relative] = f"l {mode} -> {os.readlink(path)}"
        elif stat.S_ISDIR(info.st_mode):
            entries[relative] = f"d {mode}"
        elif stat.S_ISREG(info.st_mode):
            digest = known.digest(relative, info) if known is not None else None
            entries[relative] = f"f {mode} {digest or _digest(path)}"
        else:
            entries[relative] = f"p {mode}"
    return entries


def file_digests(root: str | os.PathLike, limit: int = 5000) -> dict[str, tuple[int, int, str]]:
    """{relative path: (size, mtime_ns, md5)} of the regular files under `root` (.git left out), for
    `KnownDigests.of_copy`; `root` must not change meanwhile (a snapshot's frozen tree)."""
    return {
        relative: (info.st_size, info.st_mtime_ns, _digest(path))
        for relative, path, info in _walk(root, limit)
        if stat.S_ISREG(info.st_mode)
    }


def _digest(path: str | os.PathLike) -> str:
    # O_NOFOLLOW: a file swapped for a link after the lstat is not followed out of the sandbox.
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "unreadable"
    digest = hashlib.md5()
    with os.fdopen(descriptor, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def parse_manifest(text: str, marker: str) -> dict[str, str]:
    """The manifest the runner printed after the line "<marker> manifest" (`find` listing, then md5sums)."""
    listing, _, digests = text.partition(f"{marker} digests\n")
    entries: dict[str, str] = {}
    for line in listing.splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[0] not in "fdlps" or len(parts[0]) != 1:
            continue
        kind, mode, rest = parts
        path, _, target = rest.rpartition(" -> ")
        entries[path.removeprefix("./")] = f"{kind} {mode}" + (f" -> {target}" if kind == "l" else "")
    for line in digests.splitlines():
        digest, _, path = line.partition("  ")
        path = path.removeprefix("./")
        if path in entries:
            entries[path] += f" {digest}"
    return entries
