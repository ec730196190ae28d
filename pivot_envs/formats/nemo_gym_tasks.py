"""NeMo-Gym task rows as answer pivots.

A NeMo-Gym task row (e.g. `browsecomp_tasks.jsonl`) holds a prompt, tool schemas and the
answer, `ground_truth`, but no response: read as a rollout it is a trajectory with no assistant
turn, so extraction makes no candidate of it. Its one decision with a known expert action is the
last: at the prompt, answer. `task_pivot` makes that pivot: the prompt is the prefix, the expert
turn is `Exact Answer: <ground_truth>` (BrowseComp's answer line), and `context` keeps the row's
fields (`ground_truth`, `question`, ...) for the domain's verifier. `source["expert"]` is
"ground_truth": the expert turn was written from the answer, not recorded.
"""

from __future__ import annotations

import os
import warnings

from pivot_envs.formats.read import read_as_pivots, read_trajectories
from pivot_envs.pivot import Pivot
from pivot_envs.trajectory import ReadReport, Trajectory


def task_pivot(trajectory: Trajectory, domain: str = "") -> Pivot | None:
    """The answer pivot of a task prompt whose row carries a `ground_truth`; None for anything else
    (a trajectory with an assistant turn, a prompt without an answer)."""
    answer = trajectory.context.get("ground_truth")
    if (
        trajectory.assistant_turns
        or answer is None
        or isinstance(answer, (dict, list))
        or not trajectory.messages
    ):
        return None
    return Pivot(
        id=f"{trajectory.id}/t0",
        domain=domain,
        messages=[dict(message) for message in trajectory.messages],
        expert={"role": "assistant", "content": f"Exact Answer: {answer}"},
        tools=[dict(tool) for tool in trajectory.tools],
        context=dict(trajectory.context),
        source={
            "trajectory": trajectory.id,
            "turn": 0,
            "reward": trajectory.reward,
            "format": trajectory.format,
            "expert": "ground_truth",
        },
    )


def read_with_task_pivots(
    path: str | os.PathLike[str], domain: str = "", report: ReadReport | None = None
) -> list[Pivot]:
    """`read_as_pivots(path, domain)`, plus the answer pivot of every task row with a `ground_truth`
    (the file is read a second time only when it holds task prompts). Without a `report`, skipped
    records are announced with a warning naming the first problem, as `read_as_pivots` does."""
    own = report if report is not None else ReadReport()
    pivots = read_as_pivots(path, domain=domain, report=own)
    if own.no_assistant:
        for trajectory in read_trajectories(path, ReadReport()):
            pivot = task_pivot(trajectory, domain)
            if pivot is not None:
                pivots.append(pivot)
                own.pivots += 1
    if report is None and own.skipped_total:
        warnings.warn(
            f"{path}: skipped {own.skipped_total} malformed record(s); first: {own.problems[0]}", stacklevel=2
        )
    return pivots
