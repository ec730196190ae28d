"""The pivot record: one assistant turn of an expert trajectory, with the state before it.

A record is one JSONL line, stable across the whole pipeline (extract -> profile -> filter ->
train -> eval). Fields follow the paper: `messages` is the state s_t, `expert` the expert action
a*_t, and `profile` the reference policy's statistics at s_t (Eq. 4).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError
from pivot_envs.jsonl import iter_records


class PivotFormatError(PivotEnvsError, ValueError):
    """A pivot record that cannot be read; the message names the file, line and reason."""


@dataclass
class Profile:
    """Offline profile of a candidate under a frozen reference policy (paper Eq. 4).

    `rewards` are functional rewards, `strict_rewards` the exact-match ones, one per sample;
    `valid[i]` is False where the infrastructure (not the action) failed, and `errors[i]` says why
    ('' for a valid sample; the list is empty when every sample is valid). `mean` and `var`
    are over the valid samples only (population variance, as in Eq. 4). `settings` are what the
    profile was sampled under (reference policy, K, temperature, ...; see `profile.ProfileConfig`).
    """

    k: int
    rewards: list[float]
    mean: float
    var: float
    policy: str = ""
    strict_rewards: list[float] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    valid: list[bool] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_samples(
        cls,
        rewards: list[float],
        *,
        policy: str = "",
        strict_rewards: list[float] | None = None,
        categories: list[str] | None = None,
        valid: list[bool] | None = None,
        actions: list[str] | None = None,
        settings: dict[str, Any] | None = None,
        errors: list[str] | None = None,
    ) -> Profile:
        """Build a profile, computing mean and variance over the valid samples."""
        valid = list(valid) if valid is not None else [True] * len(rewards)
        kept = [r for r, ok in zip(rewards, valid) if ok]
        mean = sum(kept) / len(kept) if kept else 0.0
        var = sum((r - mean) ** 2 for r in kept) / len(kept) if kept else 0.0
        return cls(
            k=len(rewards),
            rewards=list(rewards),
            mean=mean,
            var=var,
            policy=policy,
            strict_rewards=list(strict_rewards or []),
            categories=list(categories or []),
            valid=valid,
            actions=list(actions or []),
            settings=dict(settings or {}),
            errors=list(errors or []),
        )

    @property
    def n_valid(self) -> int:
        return sum(1 for ok in self.valid if ok) if self.valid else self.k

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Pivot:
    """A pivot candidate (s_t, a*_t).

    id:       stable and unique: "<trajectory id>/t<assistant-turn index>".
    domain:   the domain name ("tool-use", "terminal", ...).
    messages: the prefix s_t in OpenAI chat form (system/user/assistant/tool messages).
    tools:    OpenAI function tool schemas ({"type": "function", "function": {...}}).
    expert:   the expert assistant message a*_t.
    context:  domain data (tool backend, sandbox image and setup, ...).
    source:   {"trajectory": id, "turn": index, "reward": source reward or None, "format": ...}.
    profile:  the reference policy's profile, once profiled.
    """

    id: str
    domain: str
    messages: list[dict[str, Any]]
    expert: dict[str, Any]
    tools: list[dict[str, Any]] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    profile: Profile | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSONL form of this record."""
        data = {
            "id": self.id,
            "domain": self.domain,
            "messages": self.messages,
            "tools": self.tools,
            "expert": self.expert,
            "context": self.context,
            "source": self.source,
        }
        if self.profile is not None:
            data["profile"] = self.profile.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pivot:
        """Read the JSONL form; raises PivotFormatError naming the missing or bad field."""
        if not isinstance(data, dict):
            raise PivotFormatError(f"a pivot record must be a JSON object, got {type(data).__name__}")
        for name, kind in (("id", str), ("messages", list), ("expert", dict)):
            if name not in data:
                raise PivotFormatError(f"pivot record has no '{name}' field")
            if not isinstance(data[name], kind):
                raise PivotFormatError(
                    f"pivot field '{name}' must be {kind.__name__}, got {type(data[name]).__name__}"
                )
        profile = data.get("profile")
        return cls(
            id=data["id"],
            domain=str(data.get("domain", "")),
            messages=data["messages"],
            expert=data["expert"],
            tools=list(data.get("tools") or []),
            context=dict(data.get("context") or {}),
            source=dict(data.get("source") or {}),
            profile=Profile.from_dict(profile) if isinstance(profile, dict) else None,
        )

    @property
    def trajectory_id(self) -> str:
        """The source trajectory's id (the split unit: never split a trajectory's turns)."""
        return str(self.source.get("trajectory", self.id.rsplit("/t", 1)[0]))

    @property
    def observation(self) -> dict[str, Any]:
        """The env observation at this pivot: {"messages", "tools"}."""
        return {"messages": self.messages, "tools": self.tools}


def domain_mismatch(pivots: Iterable[Pivot], domain: str) -> str | None:
    """'N of M pivots are of domain 'x', not 'y' (first: ID)' when some of `pivots` name a domain
    other than `domain` (an env of `domain` would score them with its own parser and verifier),
    else None. Pivots without a domain, and an empty `domain`, never differ."""
    if not domain:
        return None
    pivots = list(pivots)
    others = [pivot for pivot in pivots if pivot.domain and pivot.domain != domain]
    if not others:
        return None
    names = ", ".join(repr(name) for name in sorted({pivot.domain for pivot in others}))
    return (
        f"{len(others)} of {len(pivots)} pivots are of domain {names}, not {domain!r} "
        f"(first: {others[0].id}): an env of {domain!r} scores them with its own parser and verifier"
    )


def iter_pivots(path: str | os.PathLike[str]) -> Iterator[Pivot]:
    """Stream pivots from a JSONL file (or .jsonl.gz); a bad line raises PivotFormatError with its line number."""
    for number, record in iter_records(path, "pivot", PivotFormatError):
        try:
            yield Pivot.from_dict(record)
        except PivotFormatError as error:
            raise PivotFormatError(f"{path}:{number}: {error}") from None


def read_pivots(path: str | os.PathLike[str]) -> list[Pivot]:
    """All pivots of a JSONL file (see iter_pivots)."""
    return list(iter_pivots(path))


def write_pivots(
    pivots: Iterable[Pivot | dict[str, Any]], path: str | os.PathLike[str], desc: str = "writing pivots"
) -> int:
    """Write pivots as JSONL, streaming, with a progress bar labelled `desc` on stderr (shown on a
    terminal, hidden under `pivotrl -q`); returns how many were written.

    The one bulk writer: it takes Pivot records or records already in their JSON form (NeMo-Gym
    rows are written through it). One fsync at the end instead of one per line: a bulk write, not
    a resumable log (`PivotWriter` is that).
    """
    if not isinstance(path, (str, os.PathLike)):
        hint = (
            " (the arguments are swapped: write_pivots(pivots, path))"
            if isinstance(pivots, (str, os.PathLike))
            else ""
        )
        raise TypeError(f"write_pivots: path must be a str or path, got {type(path).__name__}{hint}")
    from pivot_envs.config import progress_bar

    count = 0
    with PivotWriter(path, append=False, fsync=False) as writer:
        for pivot in progress_bar(pivots, desc=desc, unit=" pivots", terminal_only=True):
            writer.write(pivot)
            count += 1
        writer.sync()
    return count


class PivotWriteError(PivotEnvsError, OSError):
    """A pivot file that cannot be written (a full disk, no permission); the message names the file."""


class PivotWriter:
    """Appends pivots to a JSONL file, each line flushed and fsynced at once (nothing lost on a crash).

    A write that fails (a full disk) raises PivotWriteError naming the file, after cutting the file
    back to its last whole line: it holds every record written before the failure and no partial
    one. A string holding a lone surrogate (not text: no UTF-8 form) is written as its JSON
    ``\\uXXXX`` escape, which reads back to the same string.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = True, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.written = 0  # records written by this writer
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Unbuffered, appending: no bytes wait in a buffer that a failed write would leave behind.
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
            self._fd = os.open(self.path, flags, 0o666)
        except OSError as error:
            raise PivotWriteError(f"{self.path}: cannot write it: {error.strerror or error}") from error
        self._end = os.fstat(self._fd).st_size  # the end of the last whole line

    def write(self, pivot: Pivot | dict[str, Any]) -> None:
        record = pivot.to_dict() if isinstance(pivot, Pivot) else pivot
        try:
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: its escape keeps it, in valid UTF-8
            line = (json.dumps(record) + "\n").encode("ascii")
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]
            if self.fsync:
                os.fsync(self._fd)
        except OSError as error:
            self._cut_back()
            raise PivotWriteError(
                f"{self.path}: cannot write it: {error.strerror or error}; it holds the "
                f"{self.written} records written before (no partial line)"
            ) from error
        self._end += len(line)
        self.written += 1

    def _cut_back(self) -> None:
        """Drop a partly written line (a full disk took only part of it)."""
        try:
            os.ftruncate(self._fd, self._end)
        except OSError:  # the file stays as it is; a resumed profile drops a partial last line itself
            pass

    def sync(self) -> None:
        """Flush what was written to the disk (for a writer opened with fsync=False)."""
        try:
            os.fsync(self._fd)
        except OSError as error:
            raise PivotWriteError(f"{self.path}: cannot write it: {error.strerror or error}") from error

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> PivotWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
