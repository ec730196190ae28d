"""A workspace's git repository state read from the host, in a form two runs of equivalent commands share.

The workspace manifest leaves a repository's `.git/` (one holding a regular file HEAD) out: its object
files differ between equivalent commands (packing, order), and its index holds stat data. What a
command did to a repository still shows in three places that do not depend on how it was done: where
HEAD points, what each ref names, and the index's entries (path, mode, object id, stage). Objects are
named by their content, and the runner fixes the author, committer and their dates
(runner.ENVIRONMENT), so `git add -A` and `git add .` leave the same index, and the same commit made two
ways gets the same id.

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

Those entries name objects by id, so the objects themselves are checked too (`_Objects`): the object of
HEAD (detached) and of each ref, the blob of each index entry (a gitlink's commit is another repository's),
and the tree of each loose commit so read (one level). An object is sound when its loose file
(objects/ab/cdef..., no link followed) inflates to "type size\\0content" of that size whose SHA-1 is its
id, or when its id is in a pack's v2 idx (binary search in the sorted id table) whose pack is a regular file
that starts "PACK", ends with the checksum the idx names and holds the object's offset; the pack's objects
are not inflated. Objects reached only through objects/info/alternates are not followed: they count as
missing. A repository where every object checked is sound has no line for them (the same text whether its
objects are loose or packed: `git gc` changes nothing); otherwise one line,

    "site" objects                2 missing, 1 corrupt, 1 unchecked

where "unchecked" counts objects past the budget: OBJECTS objects and OBJECT_BYTES bytes inflated (and
read) for loose objects per call (past it a loose object's header is still checked, its hash not), and
IDX_BYTES of idx id tables (a pack past it is not searched; an object found in no pack read is unchecked,
not missing, while one is left unread). PACKS idx files per repository at most.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import stat
import struct
import zlib
from collections.abc import Iterable

from .manifest import _DIRECTORY, _FILE, _pread_all, open_beneath

REFS = 1000  # refs (and directories under refs/) read per call, over all repositories, at most
REPOSITORIES = 16  # repositories read per workspace, at most
INDEX_BYTES = 8 << 20  # index bytes read per call, over all repositories; an index past it is not read
INDEX_ENTRIES = 5000  # index entries kept one by one; past this the index is one digest entry
PATH_BYTES = 4096  # the longest path an index entry may hold (git's PATH_MAX); past it the index is a digest
INDEX_PATH_BYTES = 2 << 20  # the paths of one index together (version 4 compresses them, so they may
# outgrow the index's own size: each entry may repeat the previous path); past it the index is a digest
_SMALL = 4096  # HEAD and a loose ref
OBJECTS = 20_000  # objects checked per call, over all repositories; the rest are "unchecked"
OBJECT_BYTES = 64 << 20  # loose object bytes read and inflated per call to check their hashes
IDX_BYTES = 64 << 20  # pack idx id tables read per call (20 bytes an object)
PACKS = 64  # pack idx files read per repository
_CHUNK = 64 << 10
_EMPTY = {"e69de29bb2d1d6434b8b29ae775ad8c2e48c5391", "4b825dc642cb6eb9a060e54bf8d69288fbee4904"}  # git
# knows the empty blob and the empty tree without reading them
_TYPES = (b"blob", b"tree", b"commit", b"tag")
_HEX = frozenset("0123456789abcdef")


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
        self.objects, self.object_bytes, self.idx_bytes = OBJECTS, OBJECT_BYTES, IDX_BYTES


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
    entries = _index_lines(git, budget)
    named = [head.decode("utf-8", "replace").strip()] if head is not None else []
    named += [refs[name] for name in sorted(refs)]
    blobs = [value.split(" ")[1] for _, value in entries[1] or () if not value.startswith("160000 ")]
    return lines + entries[0] + _Objects(git, budget).lines(named, blobs)


def _object_id(text: str) -> str | None:
    text = text.strip().lower()
    return text if len(text) == 40 and _HEX.issuperset(text) else None


class _Pack:
    """One pack's v2 idx (its sorted id table read) and its pack file, checked as the module docstring says."""

    def __init__(self, objects: int, name: str, budget: _Budget) -> None:
        self.table = b""
        self.fanout: tuple[int, ...] = ()
        self.unread = False  # over IDX_BYTES: not searched
        self.usable = False
        try:
            descriptor = os.open(name, _FILE, dir_fd=objects)
        except OSError:
            return
        try:
            info = os.fstat(descriptor)
            head = _pread_all(descriptor, 0, 8 + 1024) if stat.S_ISREG(info.st_mode) else b""
            if len(head) < 1032 or head[:8] != b"\xfftOc\x00\x00\x00\x02":
                return
            self.fanout = struct.unpack(">256I", head[8:])
            count = self.fanout[-1]
            minimum = 1032 + count * 28 + 40
            if list(self.fanout) != sorted(self.fanout) or info.st_size < minimum:
                return
            if (info.st_size - minimum) % 8 or info.st_size - minimum > count * 8:
                return
            if count * 20 > budget.idx_bytes:
                self.unread = True
                return
            budget.idx_bytes -= count * 20
            self.table = _pread_all(descriptor, 1032, count * 20)
            self.offsets = _pread_all(descriptor, 1032 + count * 24, count * 4)
            self.large = _pread_all(descriptor, 1032 + count * 28, info.st_size - minimum)
            checksum = _pread_all(descriptor, info.st_size - 40, 20)
        finally:
            os.close(descriptor)
        if len(self.table) != count * 20 or len(self.offsets) != count * 4:
            return
        self.size = self._pack_size(objects, name[: -len(".idx")] + ".pack", checksum)
        self.usable = self.size is not None

    @staticmethod
    def _pack_size(objects: int, name: str, checksum: bytes) -> int | None:
        try:
            descriptor = os.open(name, _FILE, dir_fd=objects)
        except OSError:
            return None
        try:
            info = os.fstat(descriptor)
            if not stat.S_ISREG(info.st_mode) or info.st_size < 32:
                return None
            if _pread_all(descriptor, 0, 4) != b"PACK":
                return None
            if _pread_all(descriptor, info.st_size - 20, 20) != checksum:
                return None
            return info.st_size
        finally:
            os.close(descriptor)

    def holds(self, object_id: bytes) -> bool:
        if not self.usable:
            return False
        low = self.fanout[object_id[0] - 1] if object_id[0] else 0
        high = self.fanout[object_id[0]]
        while low < high:
            middle = (low + high) // 2
            found = self.table[middle * 20 : middle * 20 + 20]
            if found == object_id:
                offset = struct.unpack(">I", self.offsets[middle * 4 : middle * 4 + 4])[0]
                if offset & 0x80000000:
                    at = (offset & 0x7FFFFFFF) * 8
                    if at + 8 > len(self.large):
                        return False
                    offset = struct.unpack(">Q", self.large[at : at + 8])[0]
                return 12 <= offset < self.size - 20
            if found < object_id:
                low = middle + 1
            else:
                high = middle
        return False


class _Objects:
    """Checks one repository's objects (module docstring) within the call's budget."""

    def __init__(self, git: int, budget: _Budget) -> None:
        self.git, self.budget = git, budget
        self.packs: list[_Pack] | None = None
        self.more_packs = False
        self.objects = -1  # objects/, open while `lines` runs
        self.absent: set[str] = set()  # the objects/xx directories found missing

    def lines(self, named: Iterable[str], blobs: Iterable[str]) -> list[str]:
        try:
            self.objects = open_beneath(self.git, "objects")
        except OSError:
            pass
        try:
            return self._lines(named, blobs)
        finally:
            if self.objects >= 0:
                os.close(self.objects)

    def _lines(self, named: Iterable[str], blobs: Iterable[str]) -> list[str]:
        counts = {"ok": 0, "missing": 0, "corrupt": 0, "unchecked": 0}
        seen: set[str] = set()
        trees: list[str] = []
        wanted = [(_object_id(text), None) for text in named] + [(blob, b"blob") for blob in blobs]
        for object_id, kind in wanted:
            if object_id is None or object_id in seen or object_id in _EMPTY:
                continue
            seen.add(object_id)
            verdict, content = self.check(object_id, kind)
            counts[verdict] += 1
            if content.startswith(b"tree ") and kind is None:
                trees.append(content[5:45].decode("ascii", "replace"))
        for tree in trees:  # one level: the trees the loose commits name
            tree_id = _object_id(tree)
            if tree_id is None:
                counts["corrupt"] += 1
            elif tree_id not in seen and tree_id not in _EMPTY:
                seen.add(tree_id)
                verdict, _ = self.check(tree_id, b"tree")
                counts[verdict] += 1
        found = ", ".join(f"{number} {name}" for name, number in counts.items() if number and name != "ok")
        return [f"objects\t{found}"] if found else []

    def check(self, object_id: str, kind: bytes | None) -> tuple[str, bytes]:
        """("ok" | "missing" | "corrupt" | "unchecked", the start of a loose commit's content or b"")."""
        if self.budget.objects <= 0:
            return "unchecked", b""
        self.budget.objects -= 1
        packed = self._packed(bytes.fromhex(object_id))  # packs first, as git looks
        if packed == "ok":
            return packed, b""
        verdict, content = self._loose(object_id, kind)
        return (packed, b"") if verdict == "missing" else (verdict, content)

    def _packed(self, object_id: bytes) -> str:
        if self.packs is None:
            self.packs = []
            try:
                pack = open_beneath(self.objects, "pack")
            except OSError:
                return "missing"
            try:
                with os.scandir(pack) as listing:
                    names = sorted(
                        entry.name
                        for entry in itertools.islice(listing, 16 * PACKS)
                        if entry.name.endswith(".idx")
                    )
                self.more_packs = len(names) > PACKS
                self.packs = [_Pack(pack, name, self.budget) for name in names[:PACKS]]
            except OSError:
                pass
            finally:
                os.close(pack)
        for number, pack in enumerate(self.packs):
            if pack.holds(object_id):
                self.packs.insert(0, self.packs.pop(number))  # the next object is likely in the same pack
                return "ok"
        return "unchecked" if self.more_packs or any(pack.unread for pack in self.packs) else "missing"

    def _loose(self, object_id: str, kind: bytes | None) -> tuple[str, bytes]:
        if self.objects < 0 or object_id[:2] in self.absent:
            return "missing", b""
        try:
            directory = os.open(object_id[:2], _DIRECTORY, dir_fd=self.objects)
        except (FileNotFoundError, NotADirectoryError):
            self.absent.add(object_id[:2])
            return "missing", b""
        except OSError:
            return "corrupt", b""  # a link, or not readable: git would not read it as we do
        try:
            descriptor = os.open(object_id[2:], _FILE, dir_fd=directory)
        except (FileNotFoundError, NotADirectoryError):
            return "missing", b""
        except OSError:
            return "corrupt", b""
        finally:
            os.close(directory)
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return "corrupt", b""
            return self._inflate(descriptor, object_id, kind)
        except (OSError, zlib.error, ValueError):
            return "corrupt", b""
        finally:
            os.close(descriptor)

    def _inflate(self, descriptor: int, object_id: str, kind: bytes | None) -> tuple[str, bytes]:
        """Inflate a loose object within the byte budget: its header at least (from the first _CHUNK bytes
        of its file), its size and hash where the budget lasts; "unchecked" where it does not."""
        inflater, digest = zlib.decompressobj(), hashlib.sha1()
        head, size, done, offset, pending, start = b"", -1, 0, 0, b"", b""
        while not inflater.eof:
            if not pending:
                if size < 0 and offset >= _CHUNK:
                    return "corrupt", b""  # no header in the first _CHUNK bytes
                pending = os.pread(descriptor, _CHUNK if self.budget.object_bytes > 0 else 512, offset)
                if not pending:
                    return "corrupt", b""  # the stream ends early
                offset += len(pending)
                self.budget.object_bytes -= len(pending)
            elif size >= 0 and self.budget.object_bytes <= 0:
                return "unchecked", start
            data = inflater.decompress(pending, _CHUNK)
            pending = inflater.unconsumed_tail
            self.budget.object_bytes -= len(data)
            digest.update(data)
            if size < 0:
                head += data
                if b"\0" not in head:
                    if len(head) > 32:
                        return "corrupt", b""
                    continue
                header, _, data = head.partition(b"\0")
                found, _, length = header.partition(b" ")
                if found not in _TYPES or not length.isdigit() or len(length) > 20:
                    return "corrupt", b""
                if kind not in (None, found):
                    return "corrupt", b""
                size = int(length)
                start = data[:64] if found == b"commit" else b""
            elif start and len(start) < 64:
                start += data[: 64 - len(start)]
            done += len(data)
            if done > size:
                return "corrupt", b""
            if not inflater.eof and self.budget.object_bytes <= 0:
                return "unchecked", start
        if done != size or digest.hexdigest() != object_id:
            return "corrupt", b""
        return "ok", start


def _index_lines(git: int, budget: _Budget) -> tuple[list[str], list[tuple[str, str]] | None]:
    """The index's lines and its entries (None where it is not read or not parsed)."""
    try:
        descriptor = os.open("index", _FILE, dir_fd=git)
    except OSError:
        return [], None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            return [f"index\tnot a file ({stat.filemode(info.st_mode)})"], None
        if info.st_size > budget.index_bytes:
            left = budget.index_bytes
            return [f"index\t{info.st_size} bytes, over the {left} left to read: not read"], None
        budget.index_bytes -= info.st_size
        data = _pread_all(descriptor, 0, info.st_size)
    finally:
        os.close(descriptor)
    entries = index_entries(data)
    if entries is None:  # over INDEX_ENTRIES or not an index: its bytes, stat data and all
        return [f"index\tnot parsed ({len(data)} bytes), digest {hashlib.sha256(data).hexdigest()}"], None
    return [f"index {json.dumps(path)}\t{value}" for path, value in entries], entries
