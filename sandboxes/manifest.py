"""A sandbox's workspace read from the host: its manifest of files (type, mode, content digest) and
the disk it uses, never following a link a command planted out of the sandbox's tree."""

from __future__ import annotations

import hashlib
import os
import stat
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


def manifest(root: str | os.PathLike, limit: int = 5000) -> dict[str, str]:
    """The workspace manifest from the host side, in the runner's format ({path: "type mode [digest]"}).

    .git is left out: commit objects differ between equivalent commands (timestamps, order).
    """
    entries: dict[str, str] = {}
    base = Path(root)
    for directory, dirs, names in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for name in [*dirs, *names]:
            if len(entries) >= limit:
                return entries
            path = Path(directory, name)
            relative = str(path.relative_to(base))
            try:
                info = path.lstat()
            except OSError:
                continue
            mode = oct(stat.S_IMODE(info.st_mode))[2:]
            if stat.S_ISLNK(info.st_mode):
                entries[relative] = f"l {mode} -> {os.readlink(path)}"
            elif stat.S_ISDIR(info.st_mode):
                entries[relative] = f"d {mode}"
            elif stat.S_ISREG(info.st_mode):
                digest = _digest(path)
                entries[relative] = f"f {mode} {digest}"
            else:
                entries[relative] = f"p {mode}"
    return entries


def _digest(path: Path) -> str:
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
