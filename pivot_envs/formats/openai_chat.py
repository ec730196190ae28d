"""The `openai-chat` format: a JSON list of episodes with a `traj` or `messages` message list
(tau-bench results), or JSONL of ``{"messages", "tools"?, "id"?, "reward"?}``; other fields go to
the trajectory's `context`.
"""

from __future__ import annotations

from pivot_envs.formats.messages import chat_tools, normalize_messages, source_reward
from pivot_envs.trajectory import Trajectory


def read_openai_chat(record: dict, default_id: str, prefix: str) -> Trajectory:
    """An OpenAI chat record (`messages` or tau-bench's `traj`) -> Trajectory; raises MalformedRecord.

    id: the record's `id`; a tau-bench episode's is `<prefix>/task<task_id>/trial<trial>`; else `default_id`.
    """
    messages = record.get("messages", record.get("traj"))
    if "task_id" in record and "traj" in record:  # a tau-bench episode: task and trial identify it
        default_id = f"{prefix}/task{record['task_id']}/trial{record.get('trial', 0)}"
    skip = {"messages", "traj", "tools", "reward", "id"}
    return Trajectory(
        id=str(record.get("id") or default_id),
        messages=normalize_messages(messages, "messages" if "messages" in record else "traj"),
        tools=chat_tools(record.get("tools")),
        reward=source_reward(record.get("reward"), "reward"),
        context={k: v for k, v in record.items() if k not in skip},
        format="openai-chat",
    )
