"""Expert trajectories in canonical chat form, and the report of reading them into pivots.

The bottom of the data pipeline: the readers in `pivot_envs.formats` produce `Trajectory`
records, `pivot_envs.extract` turns them into pivot candidates, and both count what they did in
one `ReadReport`. This module imports neither of them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Trajectory:
    """One expert trajectory in canonical chat form.

    id:       stable and unique within its source file.
    messages: OpenAI chat messages (system/user/assistant/tool).
    tools:    OpenAI function tool schemas in chat form.
    reward:   the source episode's reward, when the format records one.
    context:  domain data carried over from the source (task metadata, instance id, ...).
    format:   the format it was read from.
    """

    id: str
    messages: list[dict]
    tools: list[dict]
    reward: float | None = None
    context: dict = field(default_factory=dict)
    format: str = ""

    @property
    def assistant_turns(self) -> int:
        return sum(1 for m in self.messages if m.get("role") == "assistant")


@dataclass
class ReadReport:
    """What a read did: records read, trajectories and pivots produced, and what was skipped and why.

    skipped:  malformed records by reason (each also in `problems` as "file:line: reason").
    filtered: candidates left out on purpose by the extraction rules (ExtractConfig), by reason.
    no_assistant: trajectories without any assistant turn (task prompts): read, but no candidates.
    """

    records: int = 0
    trajectories: int = 0
    pivots: int = 0
    no_assistant: int = 0
    skipped: Counter = field(default_factory=Counter)
    filtered: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)

    def skip(self, where: str, reason: str, detail: str = "") -> None:
        """Record a skipped record: `reason` is the counted category, `detail` the specifics."""
        self.skipped[reason] += 1
        self.problems.append(f"{where}: {reason}{': ' + detail if detail else ''}")

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        """A few lines: counts, then skipped and filtered by reason."""
        lines = [
            f"records read: {self.records}",
            f"trajectories: {self.trajectories} ({self.no_assistant} without an assistant turn)",
            f"pivots: {self.pivots}",
            f"skipped (malformed): {self.skipped_total}",
        ]
        lines += [f"  {reason}: {count}" for reason, count in sorted(self.skipped.items())]
        if self.filtered:
            lines.append(f"filtered by the extraction rules: {sum(self.filtered.values())}")
            lines += [f"  {reason}: {count}" for reason, count in sorted(self.filtered.items())]
        return "\n".join(lines)
