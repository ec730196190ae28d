"""A sandbox's tree read from the host: its manifest of files (type, mode, content digest), the disk it
uses, the files the host opens in it, and what it wrote outside its writable roots.

Everything here runs as the host (often root) on a tree that commands of the sandbox may change
while it is read, so nothing follows a link or trusts a path: a root is opened one component at a
time with O_NOFOLLOW from a directory the host made (`open_beneath`), a walk opens each directory
once, O_NOFOLLOW from its parent's descriptor, and checks it is the directory that was listed
(`_entries`), entries are listed and stat'ed relative to their directory's descriptor, and files are
opened O_NOFOLLOW | O_NONBLOCK and checked to be the regular file that was listed. A directory
swapped for a link between its listing and its opening is skipped, never followed into the host.
Reads are bounded: a walk holds at most MAX_DEPTH descriptors and lists nothing deeper, reads a
directory only as far as its entry limit, a manifest hashes at most `budget` bytes, and a file's
holes are never read (`_digest`).
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# Bytes a manifest reads to hash files, at most: past it a file's digest names its size and mtime
# instead of its content (it then never equals another file's). The disk limit bounds what a
# sandbox can write far below this; the budget bounds what a huge snapshot tree costs.
HASH_BUDGET = 4 << 30
# A file over this size is hashed block by block, its holes unread (see `_digest`).
BLOCKWISE = 64 << 10
_BLOCK = 64 << 10
_ZERO_BLOCK = bytes(_BLOCK)
# Entries of one directory a walk with a limit reads at most, beyond what the limit still allows: a
# directory up to this size is listed in the walk's order whatever the limit, a bigger one in part.
LISTED = 1 << 16
# How deep a walk lists a tree: entries more than MAX_DEPTH directories below its top are left out
# (a walk holds one descriptor per level), and `disk_usage` counts a tree holding any as over its limit.
MAX_DEPTH = 128
# What `disk_usage` counts an entry as at least (one block): an empty file, a directory, a link take an
# inode of the host's filesystem, so they cost disk too.
ENTRY_BYTES = 4096


def open_beneath(root: str | os.PathLike | int, relative: str = "", flags: int = _DIRECTORY) -> int:
    """A descriptor of `root`/`relative`, opened one component at a time without following a link.

    `root` is a directory the host made (a path, opened as it is, or an open descriptor, left
    open); no component of `relative` may be a link (OSError ELOOP/ENOTDIR otherwise). The last
    component is opened with `flags` (a directory by default). The caller closes the descriptor.
    """
    parts = [part for part in Path(relative).parts if part not in ("/", ".")]
    if ".." in parts:
        raise OSError(errno.EINVAL, f"{relative!r} leaves its root")
    if isinstance(root, int):
        current = os.dup(root) if not parts else -1
    else:
        current = os.open(root, _DIRECTORY if parts else flags)
    try:
        for index, part in enumerate(parts):
            parent = root if current < 0 else current
            following = os.open(part, flags if index == len(parts) - 1 else _DIRECTORY, dir_fd=parent)
            if current >= 0:
                os.close(current)
            current = following
        return current
    except BaseException:
        if current >= 0:
            os.close(current)
        raise


def _open_root(root: str | os.PathLike, beneath: str | os.PathLike | None = None) -> int:
    if beneath is None:
        return os.open(root, _DIRECTORY)
    return open_beneath(beneath, os.path.relpath(root, beneath))


@contextmanager
def _opened(root: str | os.PathLike, beneath: str | os.PathLike | None = None):
    descriptor = _open_root(root, beneath)
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def read_bounded(root: str | os.PathLike, relative: str, limit: int) -> tuple[int, bytes, str]:
    """(size, head and tail halves up to `limit` bytes, problem) of the regular file `root`/`relative`.

    Opened without following a link and without blocking (a FIFO a command left there is not
    waited on); anything but a regular file is not read and `problem` says what it was. A missing
    file gives (0, b"", "").
    """
    try:
        descriptor = open_beneath(root, relative, _FILE)
    except FileNotFoundError:
        return 0, b"", ""
    except OSError as error:
        return 0, b"", f"the output file could not be opened ({os.strerror(error.errno or 0)})"
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            return 0, b"", "the command replaced its output file with something that is not a file"
        size = info.st_size
        if size <= limit:
            return size, _pread_all(descriptor, 0, size), ""
        half = limit // 2
        return size, _pread_all(descriptor, 0, half) + _pread_all(descriptor, size - half, half), ""
    finally:
        os.close(descriptor)


def _pread_all(descriptor: int, offset: int, length: int) -> bytes:
    chunks, done = [], 0
    while done < length:
        chunk = os.pread(descriptor, min(length - done, 1 << 20), offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


class DiskUsage(int):
    """What `disk_usage` counted, in bytes; `over` says why the walk stopped short of the whole tree:
    "entries" (more than its `most_entries`), "depth" (entries deeper than MAX_DEPTH), or "" (none)."""

    over: str

    def __new__(cls, value: int, over: str = "") -> DiskUsage:
        usage = super().__new__(cls, value)
        usage.over = over
        return usage


def disk_usage(
    root: str | os.PathLike,
    stop_above: int | None = None,
    beneath: str | os.PathLike | None = None,
    most_entries: int | None = None,
) -> DiskUsage:
    """Bytes allocated under `root` (links never followed, .git directories included: what a command
    writes there is on the host's disk too), each entry counted as at least ENTRY_BYTES; stops
    counting once above `stop_above`.

    A tree of more than `most_entries` entries, or with entries deeper than MAX_DEPTH, is not walked
    further: the answer is then above `stop_above` (the total so far where none is given) and its
    `over` says which ("entries", "depth"). One walk costs O(min(entries, most_entries)).
    """
    total, count, over = 0, 0, ""
    deep = _Deep()
    try:
        with _opened(root, beneath) as top:
            walk = _entries(
                top,
                None if most_entries is None else most_entries + 1,
                skip=frozenset(),
                deep=deep,
                ordered=False,
                repositories=False,
            )
            try:
                for _, _, info in walk:
                    count += 1
                    if most_entries is not None and count > most_entries:
                        over = "entries"
                        break
                    total += max(info.st_blocks * 512, ENTRY_BYTES)
                    if stop_above is not None and total > stop_above:
                        return DiskUsage(total)
                    if deep.found:
                        break
            finally:
                walk.close()
    except OSError:
        return DiskUsage(total)
    if not over and deep.found:
        over = "depth"
    if over and stop_above is not None:
        total = max(total, stop_above + 1)
    return DiskUsage(total, over)


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
    def of_copy(
        cls, root: str | os.PathLike, digests: dict[str, tuple[int, int, str]], limit: int = 5000
    ) -> KnownDigests:
        """The digests of `root`, a copy (mtimes kept) of a tree whose files `file_digests` hashed with the
        same entry `limit`: the walk is ordered, so the copy's first `limit` entries are the ones hashed
        and no later entry can have a digest (a copy is read no further than its snapshot was)."""
        known: dict[str, tuple[int, int, int, int, str]] = {}
        for relative, _, info in _walk(root, limit):
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
    def of_tree(
        cls, root: str | os.PathLike, limit: int = 5000, beneath: str | os.PathLike | None = None
    ) -> KnownDigests:
        """The digests of the regular files under `root` (a repository's .git left out) with their stat,
        unsealed; `root` must not change meanwhile (an image's files seen through a fresh container)."""
        budget = _Budget(HASH_BUDGET)
        return cls(
            {
                relative: (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, digest)
                for relative, digest, info in _hashed(root, limit, budget, beneath)
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


class _Deep:
    """Set by a walk (`_entries`) that left out entries deeper than MAX_DEPTH."""

    def __init__(self) -> None:
        self.found = False


def _entries(
    top: int,
    limit: int | None,
    skip: frozenset[str] = frozenset(),
    deep: _Deep | None = None,
    ordered: bool = True,
    repositories: bool = True,
) -> Iterator[tuple[str, int, os.stat_result]]:
    """(relative path, parent directory descriptor, lstat) of every entry under the open directory
    `top`, top-down: a directory's subdirectories (sorted) then its other entries, then each
    subdirectory's tree (os.walk's order; a link is never a directory here). Directories named in
    `skip` (names or relative paths) are left out, and with `repositories` each `.git` directory that
    is a repository (`is_repository`). The parent descriptor is valid until the
    next entry is yielded. At most `limit` entries (None: all).

    Depth first, holding the descriptors of the directories along the current path: each directory
    is opened once, from its parent's descriptor without following a link, and walked only when it
    is still the directory its parent's listing saw (one swapped since is skipped, never followed).
    Entries more than MAX_DEPTH directories below `top` are not listed; `deep`, when given, is told
    when there were any. A directory is read only as far as `limit` allows (see `_listing`).
    `ordered=False`: each directory's entries in listing order, yielded as they are read (nothing
    but its subdirectories is kept: a walk that only counts).
    """
    count = 0
    # One frame per directory along the current path: (descriptor, relative path + "/", the
    # subdirectories still to walk). The frames' descriptors but `top`'s are the walk's own.
    frames: list[tuple[int, str, Iterator[tuple[str, os.stat_result]]]] = [(top, "", iter(()))]
    try:
        subdirs: list[tuple[str, os.stat_result]] = []
        for name, info in _listed(top, "", skip, limit, ordered, subdirs, repositories):
            count += 1
            yield name, top, info
        frames[-1] = (top, "", iter(subdirs))
        while frames and (limit is None or count < limit):
            parent, prefix, pending = frames[-1]
            following = next(pending, None)
            if following is None:
                frames.pop()
                if parent != top:
                    os.close(parent)
                continue
            name, info = following
            if len(frames) >= MAX_DEPTH:  # its entries would lie deeper than MAX_DEPTH
                if deep is not None and not deep.found:
                    deep.found = _holds_any(parent, name, info)
                continue
            directory = _open_listed(parent, name, info)
            if directory < 0:  # swapped for a link or removed since it was listed: not followed
                continue
            path = f"{prefix}{name}/"
            frames.append((directory, path, iter(())))
            subdirs = []
            for child, child_info in _listed(
                directory,
                path,
                skip,
                None if limit is None else limit - count,
                ordered,
                subdirs,
                repositories,
            ):
                count += 1
                yield path + child, directory, child_info
            frames[-1] = (directory, path, iter(subdirs))
    finally:
        for descriptor, _, _ in frames:
            if descriptor != top:
                os.close(descriptor)


def _listed(
    directory: int,
    prefix: str,
    skip: frozenset[str],
    most: int | None,
    ordered: bool,
    subdirs: list[tuple[str, os.stat_result]],
    repositories: bool = False,
) -> Iterator[tuple[str, os.stat_result]]:
    """(name, lstat) of at most `most` entries of the open `directory` (None: all), `skip`'s
    directories (and with `repositories`, repositories' `.git`) left out; its subdirectories (sorted
    when `ordered`) are added to `subdirs`.
    `ordered`: as `_listing` gives them; else in listing order, each yielded as it is read."""
    if ordered:
        listed = _listing(directory, prefix, skip, most, repositories)
        if listed is not None:
            subdirs += listed[0]
            yield from itertools.chain(*listed)
        return
    if most is not None and most <= 0:
        return
    count = 0
    try:
        with os.scandir(directory) as listing:
            for entry in listing:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    if _left_out(directory, entry.name, prefix, skip, repositories):
                        continue
                    subdirs.append((entry.name, info))
                yield entry.name, info
                count += 1
                if most is not None and count >= most:
                    return
    except OSError:  # it cannot be listed (any more)
        return


def _listing(
    directory: int, prefix: str, skip: frozenset[str], most: int | None, repositories: bool = False
) -> tuple[list[tuple[str, os.stat_result]], list[tuple[str, os.stat_result]]] | None:
    """(subdirectories sorted by name, other entries in listing order) of the open `directory` (at
    `prefix` under the walk's top), each with its lstat; directories named in `skip` (and with
    `repositories`, repositories' `.git`) are left out, entries gone before their lstat too. None
    when it cannot be listed.

    At most `most` of them (None: all): the first `most` of the whole directory's order as long as it
    holds at most max(`most`, LISTED) entries; of a bigger one only that many are read (their
    subdirectories sorted, then the rest). Only the entries kept are stat'ed (the listing's types
    tell directories apart; an entry's lstat has the last word)."""
    if most is not None and most <= 0:
        return [], []
    try:
        with os.scandir(directory) as listing:
            read = list(listing if most is None else itertools.islice(listing, max(most, LISTED)))
    except OSError:
        return None
    dirs, others = [], []
    for entry in read:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if not is_dir:
            others.append(entry)
        elif not _left_out(directory, entry.name, prefix, skip, repositories):
            dirs.append(entry)
    dirs.sort(key=lambda entry: entry.name)
    kept: tuple[list[tuple[str, os.stat_result]], list[tuple[str, os.stat_result]]] = ([], [])
    for entry in itertools.islice(itertools.chain(dirs, others), most):
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            kept[1].append((entry.name, info))
        elif not _left_out(directory, entry.name, prefix, skip, repositories):  # checked again: it may
            kept[0].append((entry.name, info))  # not have been a directory when listed
    kept[0].sort(key=lambda pair: pair[0])  # in order but for an entry changed since the listing
    return kept


def is_repository(parent: int, name: str = ".git") -> bool:
    """Whether the directory `name` in the open directory `parent` is a git repository's: it holds a
    regular file HEAD (no link followed, `name` included). The manifest leaves such a `.git` out (the
    git state compares it, `gitstate`); any other `.git`, a file or a directory without HEAD, is listed
    like any other entry, so what a command writes there shows."""
    try:
        git = os.open(name, _DIRECTORY, dir_fd=parent)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.stat("HEAD", dir_fd=git, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(git)


def _left_out(directory: int, name: str, prefix: str, skip: frozenset[str], repositories: bool) -> bool:
    """Whether the subdirectory `name` of the open `directory` (at `prefix`) is left out of a walk."""
    if name in skip or prefix + name in skip:
        return True
    return repositories and name == ".git" and is_repository(directory, name)


def _open_listed(parent: int, name: str, listed: os.stat_result) -> int:
    """A descriptor of the directory `name` in `parent`, opened without following a link, when it is
    still the directory `listed` (same device and inode); -1 otherwise."""
    try:
        directory = os.open(name, _DIRECTORY, dir_fd=parent)
    except OSError:
        return -1
    try:
        info = os.fstat(directory)
        if (info.st_dev, info.st_ino) == (listed.st_dev, listed.st_ino):
            return directory
    except OSError:
        pass
    os.close(directory)
    return -1


def _holds_any(parent: int, name: str, listed: os.stat_result) -> bool:
    """Whether the directory `name` in `parent` (still the one `listed`) holds any entry."""
    directory = _open_listed(parent, name, listed)
    if directory < 0:
        return False
    try:
        with os.scandir(directory) as listing:
            return next(iter(listing), None) is not None
    except OSError:
        return False
    finally:
        os.close(directory)


def _walk(
    root: str | os.PathLike, limit: int | None, beneath: str | os.PathLike | None = None, own: bool = False
) -> Iterator[tuple[str, int, os.stat_result]]:
    """(relative path, parent directory descriptor, lstat) of the entries under `root` (see `_entries`);
    `beneath`: a directory the host made that `root` lies in, opened from there without following links.
    `own`: `root`'s own entry first, as "." (its descriptor, its fstat), beyond the `limit`."""
    try:
        top = _open_root(root, beneath)
    except OSError:
        return
    try:
        if own:
            yield ".", top, os.fstat(top)
        yield from _entries(top, limit)
    finally:
        os.close(top)


class _Budget:
    def __init__(self, left: int) -> None:
        self.left = left


def _hashed(
    root: str | os.PathLike, limit: int, budget: _Budget, beneath: str | os.PathLike | None
) -> Iterator[tuple[str, str, os.stat_result]]:
    for relative, directory, info in _walk(root, limit, beneath):
        if stat.S_ISREG(info.st_mode):
            yield relative, _digest(directory, relative.rsplit("/", 1)[-1], info, budget), info


def manifest(
    root: str | os.PathLike,
    limit: int = 5000,
    known: KnownDigests | None = None,
    beneath: str | os.PathLike | None = None,
    budget: int = HASH_BUDGET,
) -> dict[str, str]:
    """The workspace manifest from the host side, in the runner's format ({path: "type mode [digest]"}).

    The workspace's own entry comes first, as "." ("d <mode>": a `chmod` of the workspace shows), then
    at most `limit` entries under it. A repository's .git is left out (a `.git` directory holding a
    regular file HEAD, `is_repository`): commit objects differ between equivalent commands (timestamps,
    order), and the git state compares the repository (`gitstate`). Any other `.git` is listed.
    `known`: digests of unchanged files to reuse instead of reading them (see KnownDigests).
    `beneath`: the sandbox's tree on the host, from which `root` is opened without following links.
    At most `budget` bytes are read to hash files.
    """
    entries: dict[str, str] = {}
    left = _Budget(budget)
    for relative, directory, info in _walk(root, limit, beneath, own=True):
        name = relative.rsplit("/", 1)[-1]
        mode = oct(stat.S_IMODE(info.st_mode))[2:]
        if stat.S_ISLNK(info.st_mode):
            try:
                target = os.readlink(name, dir_fd=directory)
            except OSError:
                target = "?"
            entries[relative] = f"l {mode} -> {target}"
        elif stat.S_ISDIR(info.st_mode):
            entries[relative] = f"d {mode}"
        elif stat.S_ISREG(info.st_mode):
            digest = known.digest(relative, info) if known is not None else None
            entries[relative] = f"f {mode} {digest or _digest(directory, name, info, left)}"
        else:
            entries[relative] = f"p {mode}"
    return entries


def file_digests(root: str | os.PathLike, limit: int = 5000) -> dict[str, tuple[int, int, str]]:
    """{relative path: (size, mtime_ns, digest)} of the regular files under `root` (a repository's .git left out), for
    `KnownDigests.of_copy`; `root` must not change meanwhile (a snapshot's frozen tree)."""
    return {
        relative: (info.st_size, info.st_mtime_ns, digest)
        for relative, digest, info in _hashed(root, limit, _Budget(HASH_BUDGET), None)
    }


def _digest(directory: int, name: str, listed: os.stat_result, budget: _Budget) -> str:
    """The content digest of the regular file `name` in `directory`: the md5 of its bytes up to
    BLOCKWISE bytes; above that, "b" and the md5 of its 64 KiB blocks, each all-zero block (a hole or
    read) as one marker, so a file's holes are never read and the same content gives the same
    digest however it is stored. A file that is no longer the one listed (swapped since) is
    "unreadable"; one past the budget, "unhashed-<size>-<mtime>"."""
    try:
        descriptor = os.open(name, _FILE, dir_fd=directory)
    except OSError:
        return "unreadable"
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_ino != listed.st_ino:
            return "unreadable"
        size = info.st_size
        if min(size, info.st_blocks * 512) > budget.left:
            return f"unhashed-{size}-{info.st_mtime_ns}"
        if size > BLOCKWISE:
            return _blockwise_digest(descriptor, size, budget)
        data = _pread_all(descriptor, 0, size)
        budget.left -= len(data)
        return hashlib.md5(data).hexdigest()
    finally:
        os.close(descriptor)


def _data_ranges(descriptor: int, size: int) -> list[tuple[int, int]]:
    """The [start, end) ranges of `descriptor` that hold data (SEEK_DATA / SEEK_HOLE); all of it
    where the filesystem cannot tell."""
    ranges, position = [], 0
    try:
        while position < size:
            try:
                start = os.lseek(descriptor, position, os.SEEK_DATA)
            except OSError as error:
                if error.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            end = min(os.lseek(descriptor, start, os.SEEK_HOLE), size)
            ranges.append((start, end))
            position = end
    except OSError:
        return [(0, size)]
    return ranges


def _blockwise_digest(descriptor: int, size: int, budget: _Budget) -> str:
    digest = hashlib.md5()
    ranges = _data_ranges(descriptor, size)
    index = 0
    for block in range(0, size, _BLOCK):
        end = min(block + _BLOCK, size)
        while index < len(ranges) and ranges[index][1] <= block:
            index += 1
        if index < len(ranges) and ranges[index][0] < end:
            data = _pread_all(descriptor, block, end - block)
            budget.left -= len(data)
            digest.update(b"Z" if data == _ZERO_BLOCK[: len(data)] else b"D" + data)
        else:
            digest.update(b"Z")
    digest.update(str(size).encode())
    return "b" + digest.hexdigest()


def parse_manifest(text: str, marker: str) -> dict[str, str]:
    """The manifest the runner printed after the line "<marker> manifest": the `find` listing as
    NUL-separated pairs ("type mode ./path", link target), then md5sum's lines.

    A file name may hold any byte but NUL: a newline-separated listing let a file named
    "README\\nd 755 ./build" forge the entry of a directory nobody made. md5sum escapes such names (the
    line starts with a backslash; \\n, \\r and \\\\ in the name), which is undone here."""
    listing, _, digests = text.partition(f"{marker} digests\n")
    listing = listing.partition(f"{marker} manifest\n")[2]
    fields = listing.split("\0")
    entries: dict[str, str] = {}
    for head, target in zip(fields[0::2], fields[1::2]):  # an unpaired last field was cut: left out
        parts = head.split(" ", 2)
        if len(parts) != 3 or len(parts[0]) != 1 or parts[0] not in "fdlps":
            continue
        kind, mode, path = parts
        entries[path.removeprefix("./")] = f"{kind} {mode}" + (f" -> {target}" if kind == "l" else "")
    for line in digests.split("\n"):
        escaped = line.startswith("\\")
        digest, _, path = line[escaped:].partition("  ")
        if escaped:
            path = _unescaped(path)
        path = path.removeprefix("./")
        if path in entries and entries[path].startswith("f "):
            entries[path] += f" {digest}"
    return entries


def _unescaped(name: str) -> str:
    """A file name as md5sum escaped it (\\\\, \\n and \\r) back as it was."""
    return re.sub(r"\\(.)", lambda match: {"n": "\n", "r": "\r"}.get(match[1], match[1]), name)


OUTSIDE_ENTRIES = 10_000  # the most entries of a writable layer walked outside the writable roots


def writes_outside(
    upper: str | os.PathLike, allowed: list[str], limit: int = 50, most_entries: int = OUTSIDE_ENTRIES
) -> list[str]:
    """Absolute paths an overlay's writable layer `upper` holds outside the `allowed` roots: files,
    links and removals (whiteouts) a container's commands made there; directories only copied up
    for a file below them are not listed. Sorted, at most `limit`. The walk reads at most
    `most_entries` entries outside the roots (the copied-up directories of a few writes are a handful):
    a layer with more, however many are directories, is itself a write outside, listed as the path
    "/[more than N entries outside the writable roots]"."""
    roots = frozenset(root.strip("/") for root in allowed if root.strip("/"))
    found: list[str] = []
    walked = 0
    try:
        with _opened(upper) as top:
            for relative, _, info in _entries(top, most_entries + 1, skip=roots, repositories=False):
                walked += 1
                if walked > most_entries:
                    found.append(f"/[more than {most_entries} entries outside the writable roots]")
                    break
                # The walk skips the roots' directories only: a root's path holding something else (the
                # whiteout of a removed root, a file in its place) is a write to the root, not outside.
                if relative in roots or stat.S_ISDIR(info.st_mode):
                    continue
                found.append("/" + relative)
                if len(found) >= limit:
                    break
    except OSError:
        return found
    return sorted(found)
