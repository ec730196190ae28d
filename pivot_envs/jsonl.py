"""Line-numbered reading of JSONL files whose every line is one JSON object (task files and the like).

A bad line is an error naming the file and the line (``file:line: reason``); the caller picks the
error class, so each file kind keeps its own (a domain's task-format error, say).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError


class JsonlError(PivotEnvsError, ValueError):
    """A JSONL line that is not JSON or not an object; the message names the file and the line."""


def iter_records(
    path: str | os.PathLike[str], what: str = "record", error: type[Exception] = JsonlError
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file (or .jsonl.gz), streamed.

    Raises `error` with ``file:line: not JSON: ...`` or ``file:line: a <what> must be a JSON
    object, got <type>`` at the first bad line; a missing or unreadable file raises OSError.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:  # without its newline, an error at the line's end names this line, not the next
                record = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as bad:
                raise error(f"{path}:{number}: not JSON: {bad.msg} (column {bad.colno})") from None
            if not isinstance(record, dict):
                raise error(f"{path}:{number}: a {what} must be a JSON object, got {type(record).__name__}")
            yield number, record
