"""Command output as the host returns it: terminal escapes stripped, the middle of an over-long
output replaced by a marker line, and the random markers that delimit a report or a prompt."""

from __future__ import annotations

import re
import secrets

# Re-exported: the runner imports them from here.
from pivot_envs.text import cut_marker, join_cut

__all__ = ["cut_marker", "join_cut", "new_marker", "strip_ansi"]

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


def new_marker() -> str:
    """A random per-session marker command output cannot guess (runner headers, shell prompts)."""
    return "PIVOT" + secrets.token_hex(8)
