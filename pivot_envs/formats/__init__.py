"""Trajectory formats: readers (detected by content) onto the canonical chat form, and a NeMo-Gym writer.

Formats (`detect_format` names), one module each:

- ``openai-chat`` (`openai_chat`): a JSON list of episodes with a `traj` or `messages` message
  list (tau-bench results), or JSONL of ``{"messages", "tools"?, "id"?, "reward"?}``.
- ``nemo-gym-pivots`` (`nemo_gym_pivots`): NeMo-Gym pivot rows (`responses_create_params.input` +
  `expected_action`); each row *is* a pivot. Also written (`write_nemo_gym_rows`); a row read
  and written back is JSON-equal to what was read (NVIDIA's pivot sets included; what the pivot's
  fields cannot hold waits in `context["nemo_gym_row"]`).
- ``nemo-gym-rollouts`` (`nemo_gym_rollouts`): NeMo-Gym rollouts (`responses_create_params.input`
  + `response.output`, `reward`); a row without `response` is a task prompt (a trajectory with no
  assistant turn).
- ``sharegpt`` (`sharegpt`): ``{"conversations": [{"from", "value"}], "tools"?}``.
- ``pivots`` (`pivots`): this library's pivot JSONL (see `pivot_envs.pivot`).

Shared by them: `records` (a file's raw records, format detection), `messages` (the canonical
chat form), `responses` (OpenAI Responses API items <-> chat). `read` reads a file in any of them
(`read_trajectories`, `read_as_pivots`). The import arrow goes one way: `trajectory` and `pivot`
<- `extract` <- `formats`; nothing here is imported by `extract`.

Files may be gzip-compressed (detected by their magic bytes). A malformed record is reported in a
`ReadReport` as ``file:line: reason`` (``file:[i]: reason`` for the i-th element of a JSON list) and
skipped; reading never raises on bad content.
"""

from pivot_envs.formats.messages import ROLES, normalize_messages
from pivot_envs.formats.nemo_gym_pivots import (
    nemo_gym_row_to_pivot,
    pivot_to_nemo_gym_row,
    write_nemo_gym_rows,
)
from pivot_envs.formats.read import read_as_pivots, read_trajectories
from pivot_envs.formats.records import FORMATS, FormatError, MalformedRecord, detect_format
from pivot_envs.formats.responses import messages_to_responses, responses_to_messages
from pivot_envs.trajectory import ReadReport, Trajectory

__all__ = [
    "FORMATS",
    "ROLES",
    "FormatError",
    "MalformedRecord",
    "ReadReport",
    "Trajectory",
    "detect_format",
    "messages_to_responses",
    "nemo_gym_row_to_pivot",
    "normalize_messages",
    "pivot_to_nemo_gym_row",
    "read_as_pivots",
    "read_trajectories",
    "responses_to_messages",
    "write_nemo_gym_rows",
]
