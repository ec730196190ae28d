"""The `pivots` format: this library's pivot JSONL (`id` + `messages` + `expert`; see `pivot_envs.pivot`)."""

from __future__ import annotations

from pivot_envs.formats.messages import chat_tools, normalize_messages
from pivot_envs.formats.records import MalformedRecord
from pivot_envs.pivot import Pivot


def read_pivot_record(record: dict) -> Pivot:
    """A record of our pivot JSONL as a Pivot, kept as is once its messages, expert and tools are checked.

    Raises MalformedRecord or PivotFormatError naming the bad field.
    """
    pivot = Pivot.from_dict(record)
    normalize_messages(pivot.messages)
    normalize_messages([pivot.expert], "expert")
    if not isinstance(record.get("tools") or [], list):
        raise MalformedRecord("malformed tools", "tools must be a list")
    chat_tools(pivot.tools)
    if pivot.expert.get("role") != "assistant":
        raise MalformedRecord(
            "malformed pivot",
            f"the expert must be an assistant message, got role {pivot.expert.get('role')!r}",
        )
    return pivot
