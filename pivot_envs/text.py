"""Output cut to a byte limit: its head and tail kept around a marker line that says how many bytes
were cut. Shared by every domain that bounds what an action's execution returns (tool results,
sandbox command output)."""

from __future__ import annotations


def cut_marker(cut: int) -> str:
    """The line that replaces the middle of an over-long output."""
    return f"\n[... {cut} bytes of output cut ...]\n"


def join_cut(body: bytes, cut: int, limit: int) -> str:
    """The kept output (head and tail halves of `limit` bytes) decoded, with the marker of the `cut` bytes between."""
    if not cut:
        return body.decode("utf-8", "replace")
    half = limit // 2
    return body[:half].decode("utf-8", "replace") + cut_marker(cut) + body[half:].decode("utf-8", "replace")
