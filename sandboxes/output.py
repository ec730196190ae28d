"""Command output as the host returns it: terminal escapes stripped, the middle of an over-long
output replaced by a marker line, and the random markers that delimit a report or a prompt."""

from __future__ import annotations

import re
import secrets

_ANSI = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC ... BEL/ST (titles, hyperlinks)
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor movement)
    r"|\x1b[PX^_][^\x1b]*\x1b\\"  # DCS/SOS/PM/APC strings
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"  # stray control characters (keep \t \n \r)
)


def strip_ansi(text: str) -> str:
    """Remove terminal escape sequences, and keep only what a carriage return left visible on each line."""
    text = _ANSI.sub("", text.replace("\r\n", "\n"))
    return "\n".join(line.rsplit("\r", 1)[-1] if "\r" in line else line for line in text.split("\n"))


def cut_marker(cut: int) -> str:
    """The line that replaces the middle of an over-long output."""
    return f"\n[... {cut} bytes of output cut ...]\n"


def new_marker() -> str:
    """A random per-session marker command output cannot guess (runner headers, shell prompts)."""
    return "PIVOT" + secrets.token_hex(8)


def join_cut(body: bytes, cut: int, limit: int) -> str:
    """The kept output (head and tail halves of `limit` bytes) decoded, with the marker of the `cut` bytes between."""
    if not cut:
        return body.decode("utf-8", "replace")
    half = limit // 2
    return body[:half].decode("utf-8", "replace") + cut_marker(cut) + body[half:].decode("utf-8", "replace")
