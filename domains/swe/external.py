"""External coding traces as SWE pivots: NeMo-Gym swe_pivot rows, NeMo-Gym bash-agent rollouts
(mini-swe-agent) and OpenHands-style chat trajectories (any format `pivot_envs.formats` reads).

`read_external(path)` reads the file (every assistant turn of a trajectory is a candidate, as in
the paper's appendix) and makes each pivot an SWE pivot:

- the harness is the trace's: `fresh` for mini-swe-agent (its agent_ref, or `<returncode>` tool
  outputs), `persistent` otherwise (OpenHands: execute_bash / str_replace_editor);
- a trace without tool schemas (or with schemas the reader only inferred from the calls) gets
  the harness's default ones: bash for `fresh`, bash + str_replace_editor + submit for `persistent`;
- an expert turn that makes several calls keeps its first (a step runs one call); the number
  dropped is `context["expert_calls_dropped"]`;
- without the trace's repository image the pivot is not executable (`context["executable"] =
  False`, the reason in `context["not_executable_reason"]`): the env runs nothing and scores it
  at the `name`, `kind` or `nemo` level (`effect` falls back to `nemo` and says so), with
  `info["executed"] = False`. Given `images` (instance id -> a local Docker image holding the
  repository at `workdir`), the pivot runs on Docker at every level, `effect` included: the start
  state is a container of the image, the prefix's calls are replayed in it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from pivot_envs.errors import UnknownNameError
from pivot_envs.formats import read_as_pivots
from pivot_envs.pivot import Pivot
from pivot_envs.trajectory import ReadReport

from .parse import call_of, canonical_call
from .tools import BASH_TOOL, HARNESSES, default_tools


def harness_tools(harness: str) -> list[dict]:
    """The default tool schemas of a harness (`fresh`: bash only; `persistent`: bash, the editor, submit)."""
    return [
        tool
        for tool in default_tools()
        if harness == "persistent" or tool["function"]["name"] == BASH_TOOL["function"]["name"]
    ]


def infer_harness(pivot: Pivot) -> str:
    """The trace's harness: `fresh` for mini-swe-agent traces, else `persistent` (OpenHands)."""
    agent = str(pivot.context.get("agent_ref", "")).lower()
    if "mini_swe" in agent or "mini-swe" in agent:
        return "fresh"
    outputs = [m.get("content") for m in pivot.messages if m.get("role") == "tool"]
    if any(isinstance(text, str) and text.startswith("<returncode>") for text in outputs):
        return "fresh"
    return "persistent"


def as_swe_pivot(
    pivot: Pivot,
    *,
    images: Mapping[str, str] | None = None,
    workdir: str = "/testbed",
    harness: str | None = None,
) -> Pivot:
    """One external pivot made an SWE pivot (see the module docstring)."""
    if harness is not None and harness not in HARNESSES:
        raise UnknownNameError("harness", harness, HARNESSES)
    context: dict[str, Any] = dict(pivot.context)
    chosen = harness or str(context.get("harness") or infer_harness(pivot))
    context["harness"] = chosen
    instance = str(context.get("instance_id") or pivot.trajectory_id)
    image = (images or {}).get(instance)
    if image:
        context.update(image=image, workdir=str(context.get("workdir") or workdir), executable=True)
    else:
        context["executable"] = False
        context["not_executable_reason"] = (
            f"external trace {instance}: its repository image is not available here "
            "(read_external(..., images={instance_id: docker_image}) runs it on Docker)"
        )
    inferred = str(context.get("tools_inferred", "")).lower() == "true"
    tools = pivot.tools if pivot.tools and not inferred else harness_tools(chosen)
    expert = pivot.expert
    calls = expert.get("tool_calls") or []
    if len(calls) > 1:
        context["expert_calls_dropped"] = len(calls) - 1
        expert = {"role": "assistant", "content": expert.get("content"), "tool_calls": calls[:1]}
    if len(calls) >= 1:
        expert = canonical_call(*call_of(expert))
    return dataclasses.replace(pivot, domain="swe", tools=tools, context=context, expert=expert)


def read_external(
    path: str | os.PathLike[str],
    *,
    images: Mapping[str, str] | None = None,
    workdir: str = "/testbed",
    harness: str | None = None,
    report: ReadReport | None = None,
) -> list[Pivot]:
    """SWE pivots from a file of external coding traces (NeMo-Gym swe_pivot rows or rollouts,
    OpenHands-style chats); turns without a tool call are left out (a step must be one call).

    images:  instance id (a rollout's `instance_id`, else the trajectory id) -> a local Docker image
             holding the repository at `workdir`; pivots without one are not executed.
    harness: force a harness instead of the one inferred per trace.
    report:  malformed records are counted there (see pivot_envs.formats.read_as_pivots).
    """
    pivots = read_as_pivots(path, domain="swe", report=report)
    return [
        as_swe_pivot(pivot, images=images, workdir=workdir, harness=harness)
        for pivot in pivots
        if pivot.expert.get("tool_calls")
    ]
