"""A least-recently-used cache of values that hold a backend snapshot (a prefix state, a start state),
shared by the sandboxed domains: an evicted or cleared value's snapshot is released on the backend.

`PrefixCache` is the prefix-state cache both sandboxed domains build on: one state per distinct
prefix, keyed as the domain says, built once and forked for every sample at the pivot."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .protocol import Snapshot

Value = TypeVar("Value")


class SnapshotCache(Generic[Value]):
    """At most `capacity` values by key; `snapshot_of(value)` is the snapshot to release (None: nothing)."""

    def __init__(self, backend: Any, capacity: int, snapshot_of: Callable[[Value], Snapshot | None]) -> None:
        self.backend = backend
        self.capacity = max(1, capacity)
        self.snapshot_of = snapshot_of
        self._values: OrderedDict[str, Value] = OrderedDict()

    def get(self, key: str, build: Callable[[], Value]) -> Value:
        """The value cached under `key`, else `build()`'s, cached (evicting the least recently used)."""
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        value = build()
        self._values[key] = value
        while len(self._values) > self.capacity:
            self._release(self._values.popitem(last=False)[1])
        return value

    def clear(self) -> None:
        """Release every cached value's snapshot."""
        while self._values:
            self._release(self._values.popitem()[1])

    def _release(self, value: Value) -> None:
        snapshot = self.snapshot_of(value)
        if snapshot is not None:
            self.backend.release(snapshot)

    def __len__(self) -> int:
        return len(self._values)


@dataclass
class PrefixState:
    """A built prefix state: its snapshot and the workspace manifest there (None and `reason` when the
    prefix cannot be replayed); a domain's state adds what it measured there (the expert's effect)."""

    key: str
    replayable: bool
    reason: str = ""
    snapshot: Snapshot | None = None
    before: dict[str, str] = field(default_factory=dict)


State = TypeVar("State", bound=PrefixState)


class PrefixCache(Generic[State]):
    """A domain's prefix states, built on demand once per key and at most `capacity` kept (least recently
    used evicted, its snapshot released). A domain says what identifies a pivot's prefix (`prefix_key`)
    and how to build its state (`build`); `builds` counts builds (G resets at one pivot: one build, G forks).
    """

    def __init__(self, backend: Any, capacity: int = 16) -> None:
        self.backend = backend
        self.builds = 0
        self._states: SnapshotCache[State] = SnapshotCache(backend, capacity, lambda state: state.snapshot)
        # Each pivot's key, by the pivot object (every reset asks; making one parses the whole prefix).
        self._keys: dict[int, tuple[Any, str]] = {}

    def prefix_key(self, pivot: Any) -> str:
        """What identifies the pivot's prefix state (the domain's)."""
        raise NotImplementedError

    def build(self, pivot: Any, key: str) -> State:
        """The pivot's prefix state, built now (the domain's)."""
        raise NotImplementedError

    def key(self, pivot: Any) -> str:
        """`prefix_key(pivot)`, remembered per pivot object."""
        known = self._keys.get(id(pivot))
        if known is not None and known[0] is pivot:
            return known[1]
        if len(self._keys) >= 4096:
            self._keys.clear()
        key = self.prefix_key(pivot)
        self._keys[id(pivot)] = (pivot, key)
        return key

    def get(self, pivot: Any) -> State:
        """The prefix state of `pivot`, built now if it is not cached."""
        key = self.key(pivot)
        return self._states.get(key, lambda: self._count_build(pivot, key))

    def _count_build(self, pivot: Any, key: str) -> State:
        self.builds += 1
        return self.build(pivot, key)

    def clear(self) -> None:
        """Release every cached snapshot."""
        self._states.clear()

    def __len__(self) -> int:
        return len(self._states)


def freeze(sandbox: Any) -> tuple[dict[str, str], Snapshot]:
    """The workspace manifest of `sandbox` and a snapshot of it: a prefix state's `before` and `snapshot`."""
    before = sandbox.run(":", files=True).files or {}
    return before, sandbox.snapshot()
