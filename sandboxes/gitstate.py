"""A workspace's git repository state read from the host, in a form two runs of equivalent commands share.

The workspace manifest leaves `.git/` out: its object files differ between equivalent commands (packing,
order), and its index holds stat data. What a command did to a repository still shows in three places
that do not depend on how it was done: where HEAD points, what each ref names, and the index's entries
(path, mode, object id, stage). Objects are named by their content, and the runner fixes the author,
committer and their dates (runner.ENVIRONMENT), so `git add -A` and `git add .` leave the same index,
and the same commit made two ways gets the same id.

`git_state(root, workspace, directories)` reads those from the host side of a sandbox, for the
repository of the workspace and of each of its directories the manifest lists (a task's repository
is often a subdirectory: `/app/site`), without running git (a sample's `.git/config` could name a
command, `core.fsmonitor`, that git would run) and without following a link
(`manifest.open_beneath`). It returns text, one entry a line, `key<TAB>value`, each key led by its
repository's directory, JSON-quoted:

    "site" HEAD                   "ref: refs/heads/master"
    "site" ref "refs/heads/master"    "<object id>"
    "site" index "notes.txt"      100644 <object id> 0

or "" where no repository is found, or None where the workspace could not be read (it is gone).
Reads are bounded: REPOSITORIES repositories; HEAD and each loose ref at most 4 KiB, packed-refs
1 MiB; REFS entries under refs/ (refs and their directories) and INDEX_BYTES of index over all
repositories together. Past INDEX_ENTRIES entries (or an index that does not parse) an index is one
entry, a digest of its bytes: it still tells two states apart, and stat data then differs too.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import stat
import struct
from collections.abc import Iterable

from .manifest import _FILE, _pread_all, open_beneath

REFS = 1000  # refs (and directories under refs/) read per call, over all repositories, at most
REPOSITORIES = 16  # repositories read per workspace, at most
INDEX_BYTES = 8 << 20  # index bytes read per call, over all repositories; an index past it is not read
INDEX_ENTRIES = 5000  # index entries kept one by one; past this the index is one digest entry
PATH_BYTES = 4096  # the longest path an index entry may hold (git's PATH_MAX); past it the index is a digest
INDEX_PATH_BYTES = 2 << 20  # the paths of one index together (version 4 compresses them, so they may
# outgrow the index's own size: each entry may repeat the previous path); past it the index is a digest
_SMALL = 4096  # HEAD and a loose ref


def _read(directory: int, name: str, limit: int) -> bytes | None:
    """At most `limit` bytes of the regular file `name` in `directory` (no link followed), or None."""
    try:
        descriptor = os.open(name, _FILE, dir_fd=directory)
    except OSError:
        return None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            return None
        return _pread_all(descriptor, 0, min(info.st_size, limit))
    finally:
        os.close(descriptor)


def _text(data: bytes) -> str:
    return json.dumps(data.decode("utf-8", "replace").strip())


class _Budget:
    """What one `git_state` call may still read, over all its repositories."""

    def __init__(self) -> None:
        self.refs, self.index_bytes = REFS, INDEX_BYTES


def _loose_refs(git: int, most: int) -> dict[str, str]:
    """{ref name: its content} of the files under refs/, no link followed, with at most `most` entries
    (files and directories alike) listed: a million refs or nested directories cost `most`."""
    refs: dict[str, str] = {}
    pending, seen = ["refs"], 0
    while pending and seen < most:
        prefix = pending.pop()
        try:
            directory = open_beneath(git, prefix)
        except OSError:
            continue
        try:
            with os.scandir(directory) as listing:
                entries = sorted(itertools.islice(listing, most - seen), key=lambda entry: entry.name)
            seen += len(entries)
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                name = f"{prefix}/{entry.name}"
                if stat.S_ISDIR(info.st_mode):
                    pending.append(name)
                elif stat.S_ISREG(info.st_mode):
                    content = _read(directory, entry.name, _SMALL)
                    if content is not None:
                        refs[name] = content.decode("utf-8", "replace").strip()
        except OSError:
            continue
        finally:
            os.close(directory)
    return refs


def _packed_refs(git: int, most: int) -> dict[str, str]:
    data = _read(git, "packed-refs", 1 << 20) or b""
    refs: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith(("#", "^")) or " " not in line:
            continue
        object_id, name = line.split(" ", 1)
        refs[name.strip()] = object_id.strip()
        if len(refs) >= most:
            break
    return refs


def index_entries(data: bytes, most: int = INDEX_ENTRIES) -> list[tuple[str, str]] | None:
    """[(path, "mode object-id stage")] of a git index (versions 2-4), stat data left out; None when it
    does not parse or holds more than `most` entries, a path longer than PATH_BYTES, or more than
    INDEX_PATH_BYTES of paths in all. Linear in the index's size."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return None
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4) or count > most:
        return None
    entries: list[tuple[str, str]] = []
    at, previous, paths = 12, b"", 0
    try:
        for _ in range(count):
            start = at
            mode = struct.unpack(">I", data[at + 24 : at + 28])[0]
            object_id = data[at + 40 : at + 60]
            flags = struct.unpack(">H", data[at + 60 : at + 62])[0]
            extended = 2 if version >= 3 and flags & 0x4000 else 0
            at += 62 + extended
            if version == 4:  # the previous path less `strip` bytes, then a NUL-ended suffix
                byte = data[at]
                at += 1
                strip = byte & 0x7F
                while byte & 0x80:
                    if strip > len(previous):  # checked as it grows: an endless number costs nothing
                        return None
                    byte = data[at]
                    at += 1
                    strip = ((strip + 1) << 7) | (byte & 0x7F)
                if strip > len(previous):
                    return None
                end = data.index(b"\0", at, at + PATH_BYTES + 1)
                path = previous[: len(previous) - strip] + data[at:end]
                at = end + 1
            else:  # the path, then 1-8 NULs to a multiple of 8 bytes
                end = data.index(b"\0", at, at + PATH_BYTES + 1)
                path = data[at:end]
                at = start + (62 + extended + len(path)) // 8 * 8 + 8
            paths += len(path)
            if len(object_id) != 20 or at > len(data) or len(path) > PATH_BYTES or paths > INDEX_PATH_BYTES:
                return None
            previous = path
            value = f"{mode:o} {object_id.hex()} {(flags >> 12) & 3}"
            entries.append((path.decode("utf-8", "surrogateescape"), value))
    except (struct.error, ValueError, IndexError):
        return None
    return entries


def git_state(root: str | os.PathLike, workspace: str, directories: Iterable[str] = ()) -> str | None:
    """The state of the git repositories at `root`/`workspace` and at its `directories` (relative paths:
    the manifest's directories) as text (module docstring), each entry's key led by its repository's
    JSON-quoted directory ("" for the workspace's own); "" where none holds a `.git` directory, None when
    the workspace cannot be opened. At most REPOSITORIES repositories are read."""
    try:
        top = open_beneath(root, workspace)
    except OSError:
        return None
    lines: list[str] = []
    try:
        found, budget = 0, _Budget()
        for directory in ("", *directories):
            try:
                git = open_beneath(top, os.path.join(directory, ".git"))
            except OSError:
                continue  # no repository there (or a .git that is not a directory: not read)
            try:
                if found == REPOSITORIES:
                    lines.append(f"repositories\tmore than {REPOSITORIES}: the rest not read")
                    break
                found += 1
                lines += [f"{json.dumps(directory)} {line}" for line in _repository(git, budget)]
            finally:
                os.close(git)
    finally:
        os.close(top)
    return "\n".join(lines)


def _repository(git: int, budget: _Budget) -> list[str]:
    """One repository's entries, `key<TAB>value`, from its open .git directory, within `budget`."""
    lines = []
    head = _read(git, "HEAD", _SMALL)
    if head is not None:
        lines.append(f"HEAD\t{_text(head)}")
    packed = _packed_refs(git, budget.refs)
    refs = {**packed, **_loose_refs(git, budget.refs - len(packed))}
    budget.refs -= len(refs)
    lines += [f"ref {json.dumps(name)}\t{json.dumps(refs[name])}" for name in sorted(refs)]
    return lines + _index_lines(git, budget)


def _index_lines(git: int, budget: _Budget) -> list[str]:
    try:
        descriptor = os.open("index", _FILE, dir_fd=git)
    except OSError:
        return []
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            return [f"index\tnot a file ({stat.filemode(info.st_mode)})"]
        if info.st_size > budget.index_bytes:
            return [f"index\t{info.st_size} bytes, over the {budget.index_bytes} left to read: not read"]
        budget.index_bytes -= info.st_size
        data = _pread_all(descriptor, 0, info.st_size)
    finally:
        os.close(descriptor)
    entries = index_entries(data)
    if entries is None:  # over INDEX_ENTRIES or not an index: its bytes, stat data and all
        return [f"index\tnot parsed ({len(data)} bytes), digest {hashlib.sha256(data).hexdigest()}"]
    return [f"index {json.dumps(path)}\t{value}" for path, value in entries]
