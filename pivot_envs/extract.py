"""Pivot candidates from trajectories (D_cand, paper Eq. 3 context), the D_adv filter (Eq. 5),
near-duplicate removal and the train/held-out split by trajectory.

Works on `Trajectory` and `Pivot` records, never on files: reading is `pivot_envs.formats` (which
imports this module, not the other way round), writing is `pivot_envs.pivot.write_pivots`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pivot_envs.chat import calls_of, text_of
from pivot_envs.config import ConfigError, option
from pivot_envs.errors import PivotSetError, UnknownNameError
from pivot_envs.pivot import Pivot, write_pivots
from pivot_envs.trajectory import ReadReport, Trajectory

FILTER_MODES = ("adv", "adv-or-unsolved", "cand")
DEDUP_RULES = ("action", "state")


@dataclass
class ExtractConfig:
    """Which assistant turns of which trajectories become pivot candidates."""

    domain: str = option("", "domain name written into every pivot (tool-use, terminal, swe, search, ...)")
    min_source_reward: float | None = option(
        None, "keep only trajectories whose source reward is >= this (e.g. 1.0: successful episodes only)"
    )
    keep_unrewarded: bool = option(
        True,
        "with --min-source-reward: keep trajectories that record no reward at all (they cannot be judged)",
    )
    message_turns: bool = option(True, "keep assistant turns that are a message with no tool call")
    multi_call_turns: bool = option(True, "keep assistant turns with several (parallel) tool calls")
    infer_tools: bool = option(
        True,
        "trajectories without tool schemas get minimal ones inferred from the tool calls in the same input "
        "file (names, argument names and JSON types); such pivots carry context['tools_inferred']",
    )


@dataclass
class FilterConfig:
    """Which profiled candidates become training pivots."""

    mode: str = option(
        "adv",
        "adv: D_adv of paper Eq. 5 (profile var > 0 and mean < lambda_diff); adv-or-unsolved: D_adv, or when it "
        "is empty the candidates with mean < lambda_diff (the reference solved none of their K samples, yet a "
        "training group of G > K samples may be mixed; not the paper's); cand: keep every candidate",
        choices=FILTER_MODES,
    )
    lambda_diff: float = option(
        0.6,
        "difficulty threshold lambda_diff of paper Eq. 5: keep mean reward < this (the paper gives no value; "
        "pivotrl stats counts D_adv at the same one)",
    )
    dedup: bool = option(False, "drop near-duplicate expert actions, keeping the first (see --dedup-by)")
    dedup_by: str = option(
        "action",
        "action: same normalized expert action anywhere (the paper's command dedup); "
        "state: same prefix and same normalized action",
        choices=DEDUP_RULES,
    )

    def __post_init__(self) -> None:
        from pivot_envs.config import between, one_of

        one_of(self, "mode", FILTER_MODES)
        between(self, "lambda_diff", 0, 1)
        one_of(self, "dedup_by", DEDUP_RULES)


# bool before int: a bool is an int to isinstance.
_JSON_TYPES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _json_type(value: Any) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "null")


def infer_tool_schemas(trajectories: Iterable[Trajectory]) -> list[dict]:
    """Minimal tool schemas from the tool calls the trajectories make (for sources that record none).

    One schema per tool name: each argument seen becomes a property with the JSON type(s) seen;
    arguments present in every call are required. Sorted by name.
    """
    seen: dict[str, dict[str, set[str]]] = {}
    calls_per_tool: dict[str, int] = {}
    present: dict[str, dict[str, int]] = {}
    for trajectory in trajectories:
        for message in trajectory.messages:
            if message.get("role") != "assistant":
                continue
            for name, arguments in calls_of(message):
                props = seen.setdefault(name, {})
                calls_per_tool[name] = calls_per_tool.get(name, 0) + 1
                counts = present.setdefault(name, {})
                for key, value in arguments.items() if isinstance(arguments, dict) else []:
                    props.setdefault(key, set()).add(_json_type(value))
                    counts[key] = counts.get(key, 0) + 1
    tools = []
    for name in sorted(seen):
        properties = {}
        for key, types in sorted(seen[name].items()):
            kinds = sorted(types - {"null"}) or ["null"]
            properties[key] = {"type": kinds[0] if len(kinds) == 1 else kinds}
        required = sorted(k for k, n in present[name].items() if n == calls_per_tool[name])
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": "Inferred from the recorded calls (the source has no tool schemas).",
                    "parameters": {"type": "object", "properties": properties, "required": required},
                },
            }
        )
    return tools


def turn_rejection(expert: dict, config: ExtractConfig) -> str | None:
    """Why the config leaves this expert turn out (None: keep it)."""
    calls = expert.get("tool_calls") or []
    if not calls and not text_of(expert):
        return "empty assistant turn (no text, no tool call)"
    if not calls and not config.message_turns:
        return "message turn (message_turns is off)"
    if len(calls) > 1 and not config.multi_call_turns:
        return "multi-call turn (multi_call_turns is off)"
    return None


def reward_rejection(reward: float | None, config: ExtractConfig) -> str | None:
    """Why the config leaves out a trajectory with this source reward (None: keep it)."""
    if config.min_source_reward is None:
        return None
    if reward is None:
        return None if config.keep_unrewarded else "trajectory without a source reward"
    return "source reward below min_source_reward" if reward < config.min_source_reward else None


def extract_pivots(
    trajectories: Iterable[Trajectory], config: ExtractConfig | None = None, report: ReadReport | None = None
) -> Iterator[Pivot]:
    """One pivot candidate per assistant turn (D_cand).

    A candidate's `messages` are everything before the turn, `expert` is the turn itself, `tools`
    and `context` come from the trajectory, and `source` is {"trajectory", "turn" (assistant-turn
    index), "reward", "format"}. Ids are `<trajectory id>/t<assistant-turn index>`, counted over all
    assistant turns, so they do not change with the config. Turns left out by the config (and
    assistant turns with no text and no tool call, or with no prefix) are counted in
    `report.filtered`, by reason.
    """
    config = config or ExtractConfig()
    report = report if report is not None else ReadReport()
    inferred: list[dict] = []
    if config.infer_tools:
        trajectories = list(trajectories)
        if any(not t.tools and any(m.get("tool_calls") for m in t.messages) for t in trajectories):
            inferred = infer_tool_schemas(t for t in trajectories if not t.tools)
    for trajectory in trajectories:
        rejected = reward_rejection(trajectory.reward, config)
        if rejected:
            report.filtered[rejected] += trajectory.assistant_turns
            continue
        tools, context = trajectory.tools, trajectory.context
        if not tools and inferred:
            tools, context = inferred, {**context, "tools_inferred": True}
        turn = -1
        for index, message in enumerate(trajectory.messages):
            if message.get("role") != "assistant":
                continue
            turn += 1
            reason = turn_rejection(message, config) or (
                "assistant turn with no prefix" if index == 0 else None
            )
            if reason:
                report.filtered[reason] += 1
                continue
            report.pivots += 1
            prefix, expert, own_tools, own_context = _clone(
                (trajectory.messages[:index], message, tools, context)
            )
            yield Pivot(
                id=f"{trajectory.id}/t{turn}",
                domain=config.domain,
                messages=prefix,
                expert=expert,
                tools=own_tools,
                context=own_context,
                source={
                    "trajectory": trajectory.id,
                    "turn": turn,
                    "reward": trajectory.reward,
                    "format": trajectory.format,
                },
            )


def _clone(value: Any) -> Any:
    """An independent copy (each pivot owns its data); a JSON round trip is ~10x faster than deepcopy."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return copy.deepcopy(value)


def filter_pivots(
    pivots: Iterable[Pivot], lambda_diff: float = FilterConfig.lambda_diff, mode: str = "adv"
) -> list[Pivot]:
    """D_adv (paper Eq. 5): profiled variance > 0 and mean < lambda_diff; `mode="cand"` keeps all (D_cand);
    `mode="adv-or-unsolved"` is D_adv, or when that is empty the candidates with mean < lambda_diff.

    Raises PivotSetError naming the first pivot without a profile (every mode but "cand").
    """
    if mode not in FILTER_MODES:
        raise UnknownNameError("filter mode", mode, FILTER_MODES)
    pivots = list(pivots)
    if mode == "cand":
        return pivots
    for pivot in pivots:
        if pivot.profile is None:
            raise PivotSetError(
                f"pivot {pivot.id} has no profile: profile it first (pivotrl profile) or use mode 'cand'"
            )
    kept = [p for p in pivots if p.profile.var > 0 and p.profile.mean < lambda_diff]
    if kept or mode == "adv":
        return kept
    return [p for p in pivots if p.profile.mean < lambda_diff]


_SPACE = re.compile(r"\s+")


def _normalize(value: Any) -> Any:
    """Collapse whitespace runs in every string (commands differing only in spacing are one command)."""
    if isinstance(value, str):
        return _SPACE.sub(" ", value).strip()
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    return value


def normalized_action(message: dict) -> str:
    """An assistant message's action for dedup: tool names, parsed arguments and text, whitespace collapsed."""
    return json.dumps(
        {"content": _normalize(text_of(message)), "calls": _normalize(calls_of(message))},
        sort_keys=True,
        ensure_ascii=False,
    )


def dedup_pivots(pivots: Iterable[Pivot], by: str = "action") -> list[Pivot]:
    """Drop near-duplicate pivots, keeping the first of each group, in order.

    by="action": two pivots are duplicates when their expert actions are equal after
    normalization (tool names, arguments parsed as JSON, whitespace runs collapsed in every string
    and in the text), whatever their prefixes: the paper's command dedup for diversity.
    by="state": duplicates need the same normalized action *and* the same prefix (messages and
    tools), i.e. the same decision repeated (e.g. a trajectory read twice).
    """
    if by not in DEDUP_RULES:
        raise UnknownNameError("dedup rule", by, DEDUP_RULES)
    seen: set[str] = set()
    kept = []
    for pivot in pivots:
        key = normalized_action(pivot.expert)
        if by == "state":
            state = json.dumps([_normalize(pivot.messages), pivot.tools], sort_keys=True, ensure_ascii=False)
            key = hashlib.sha256(f"{state}\n{key}".encode()).hexdigest()
        if key not in seen:
            seen.add(key)
            kept.append(pivot)
    return kept


def heldout_side(trajectory_id: str, heldout_fraction: float, seed: int = 0) -> bool:
    """Whether a trajectory goes to the held-out side: a hash of (seed, id), stable across runs and machines."""
    digest = hashlib.sha256(f"{seed}\0{trajectory_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < heldout_fraction


def split_by_trajectory(
    pivots: Iterable[Pivot], heldout_fraction: float, seed: int = 0
) -> tuple[list[Pivot], list[Pivot]]:
    """(train, heldout): whole source trajectories go to one side, never single turns.

    Each trajectory lands on the held-out side with probability `heldout_fraction`, decided by a
    seeded hash of its id, so the split is deterministic and does not depend on the order or the
    other pivots.
    """
    if not 0.0 <= heldout_fraction <= 1.0:
        raise ConfigError(f"heldout_fraction must be in [0, 1], got {heldout_fraction}")
    train, heldout = [], []
    for pivot in pivots:
        (heldout if heldout_side(pivot.trajectory_id, heldout_fraction, seed) else train).append(pivot)
    return train, heldout


@dataclass
class SplitConfig:
    """The train / held-out split by source trajectory."""

    heldout: float = option(0.2, "fraction of source trajectories (not turns) that go to the held-out side")
    seed: int = option(0, "seed of the trajectory hash: another seed, another split")

    def __post_init__(self) -> None:
        from pivot_envs.config import between

        between(self, "heldout", 0, 1)


# The name the CLI writes pivot files with: the one pivot writer, under its older name.
write_pivot_file = write_pivots
