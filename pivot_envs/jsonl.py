"""Line-numbered reading of JSONL files whose every line is one JSON object (task files and the like),
and what every reader of our files shares: gzip streams read as far as they go, a UTF-8 BOM
ignored, and records holding a lone surrogate told apart.

A bad line is an error naming the file and the line (``file:line: reason``); the caller picks the
error class, so each file kind keeps its own (a domain's task-format error, say).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError

BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark: some editors and Windows tools start files with it
GZIP_MAGIC = b"\x1f\x8b"
# The only way a lone surrogate gets into parsed JSON is a \uD800-\uDFFF escape (strict UTF-8
# decoding refuses encoded ones), so a line without one needs no walk.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class JsonlError(PivotEnvsError, ValueError):
    """A JSONL line that is not JSON or not an object; the message names the file and the line."""


class GzipCut(Exception):
    """A gzip stream that ends early (cut off or corrupt); `reason` says after which line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_lines(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """The lines of a file, streamed, each with its newline (split at b"\\n" only: text mode would
    also split at \\r and U+2028 inside a line); gunzipped when the file starts with gzip's magic,
    whatever its name; the first without a UTF-8 BOM. A gzip stream that ends early raises
    GzipCut after its last whole line (a line the cut went through is not yielded)."""
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        lines = gzip.GzipFile(fileobj=raw) if gzipped else raw
        number = 0
        try:
            for number, line in enumerate(lines, start=1):
                yield line.removeprefix(BOM) if number == 1 else line
        except EOFError:
            raise GzipCut(f"the gzip stream is cut off after line {number}") from None
        except (OSError, zlib.error) as error:
            if not gzipped:
                raise
            raise GzipCut(f"the gzip stream is corrupt after line {number} ({error})") from None


def read_text_bytes(path: str | os.PathLike[str]) -> tuple[bytes, str | None]:
    """A file's bytes (see read_lines: gunzipped, without a BOM) and why its gzip stream stopped
    early (None when whole); of a stream that ends early, the whole lines before the cut."""
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
    if not gzipped:
        return Path(path).read_bytes().removeprefix(BOM), None
    kept: list[bytes] = []
    try:
        kept.extend(read_lines(path))
    except GzipCut as cut:
        return b"".join(kept), cut.reason
    return b"".join(kept), None


def may_hold_surrogate(line: bytes) -> bool:
    """Whether a raw JSON text could parse to a string holding a lone surrogate (a \\uD8xx-\\uDFxx
    escape in it; a false alarm costs one walk of `lone_surrogate`)."""
    return _SURROGATE_ESCAPE.search(line) is not None


def lone_surrogate(value: Any) -> str | None:
    """Where a parsed JSON value holds a string (or key) with a lone surrogate, as a field path
    (`messages[1].content`), or None. Such a string is not Unicode text: no UTF-8 file, HTTP body,
    tokenizer or sandbox can take it."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if not _encodes(item):
                return where or "the value"
        elif isinstance(item, dict):
            for key, inner in reversed(item.items()):
                name = f"{where}.{key}" if where else str(key)
                if not _encodes(key):
                    return f"a key of {where or 'the record'}"
                stack.append((name, inner))
        elif isinstance(item, list):
            stack.extend((f"{where}[{index}]", inner) for index, inner in reversed(list(enumerate(item))))
    return None


def _encodes(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def surrogate_problem(record: Any) -> str | None:
    """'a lone surrogate in FIELD: ...' when a record holds one, else None (see lone_surrogate)."""
    where = lone_surrogate(record)
    if where is None:
        return None
    return f"a lone surrogate (an unpaired \\uD800-\\uDFFF escape) in {where}: not Unicode text"


def iter_records(
    path: str | os.PathLike[str], what: str = "record", error: type[Exception] = JsonlError
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file (or .jsonl.gz), streamed.

    Raises `error` with ``file:line: not JSON: ...``, ``file:line: not UTF-8 ...``, ``file:line: a
    lone surrogate ...`` or ``file:line: a <what> must be a JSON object, got <type>`` at the first
    bad line, and ``file: the gzip stream is cut off after line N ...`` after the last whole line
    of a cut-off .gz; a leading UTF-8 BOM is ignored; a missing or unreadable file raises OSError.
    """
    path = Path(path)
    try:
        for number, line in enumerate(read_lines(path), start=1):
            if line.strip():
                yield number, _record(path, number, line, what, error)
    except GzipCut as cut:
        raise error(f"{path}: {cut.reason}; the lines before it were read") from None


def _record(path: Path, number: int, line: bytes, what: str, error: type[Exception]) -> dict[str, Any]:
    """One line's object; raises `error` naming the file and the line."""
    try:  # without its newline, an error at the line's end names this line, not the next
        record = json.loads(line.rstrip(b"\r\n").decode("utf-8"))
    except UnicodeDecodeError as bad:
        raise error(f"{path}:{number}: not UTF-8 at byte {bad.start}") from None
    except json.JSONDecodeError as bad:
        raise error(f"{path}:{number}: not JSON: {bad.msg} (column {bad.colno})") from None
    if not isinstance(record, dict):
        raise error(f"{path}:{number}: a {what} must be a JSON object, got {type(record).__name__}")
    if may_hold_surrogate(line):
        problem = surrogate_problem(record)
        if problem:
            raise error(f"{path}:{number}: {problem}")
    return record
