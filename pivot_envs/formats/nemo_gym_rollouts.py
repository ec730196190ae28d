"""The `nemo-gym-rollouts` format: NeMo-Gym rollouts (`responses_create_params.input` +
`response.output`, `reward`). A row without `response` is a task prompt: a trajectory with no
assistant turn.
"""

from __future__ import annotations

from typing import Any

from pivot_envs.formats.messages import chat_tools, source_reward
from pivot_envs.formats.records import MalformedRecord
from pivot_envs.formats.responses import extra_params, request_params, responses_input, responses_to_messages
from pivot_envs.trajectory import Trajectory


def read_rollout(record: dict, default_id: str) -> Trajectory:
    """A NeMo-Gym rollout -> Trajectory; raises MalformedRecord.

    id: `uuid` or `id`, else `<instance_id>/rollout<_ng_rollout_index>`, else `default_id`. Task
    metadata is lifted into `context`, the other set request parameters go under
    `context["responses_create_params"]`.
    """
    params = request_params(record)
    response = record.get("response")
    if response is not None and not isinstance(response, dict):
        raise MalformedRecord("wrong type", "response must be an object")
    output = (response or {}).get("output") or []
    items = responses_input(params)
    if not isinstance(items, list) or not isinstance(output, list):
        raise MalformedRecord("wrong type", "input and response.output must be lists of items")
    messages = responses_to_messages([*items, *output])
    extra = extra_params(params)
    context: dict[str, Any] = {
        k: v
        for k, v in record.items()
        if k not in ("responses_create_params", "response", "reward", "instance_config")
    }
    metadata = extra.pop("metadata", None)
    if isinstance(metadata, dict):  # task metadata (instance id, task name, image, workdir): lift it up
        for key, value in metadata.items():
            context.setdefault(key, value)
    if extra:
        context["responses_create_params"] = extra
    if response and response.get("model"):
        context.setdefault("model", response["model"])
    instance = context.get("instance_id")
    if isinstance(instance, str) and instance and not record.get("uuid"):
        default_id = f"{instance}/rollout{record.get('_ng_rollout_index', 0)}"
    return Trajectory(
        id=str(record.get("uuid") or record.get("id") or default_id),
        messages=messages,
        tools=chat_tools(params.get("tools"), "responses_create_params.tools"),
        reward=source_reward(record.get("reward"), "reward"),
        context=context,
        format="nemo-gym-rollouts",
    )
