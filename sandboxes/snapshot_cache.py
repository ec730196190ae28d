"""A least-recently-used cache of values that hold a backend snapshot (a prefix state, a start state),
shared by the sandboxed domains: an evicted or cleared value's snapshot is released on the backend."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
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
