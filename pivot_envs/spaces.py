"""Gymnasium spaces for chat observations and completion actions.

`Chat` holds {"messages": [...], "tools": [...]} in the canonical chat form; `Completion` holds
what a policy produces: raw completion text, or an already-parsed assistant message dict. Both
are registered with gymnasium's vector utilities so `gym.make_vec` batches them as tuples.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import utils as vector_utils

from pivot_envs.errors import PivotEnvsError

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class Chat(spaces.Space[dict]):
    """Observation space of pivot envs: a chat prefix and the tools offered."""

    def __init__(self, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if (
            not isinstance(x, dict)
            or not isinstance(x.get("messages"), list)
            or not isinstance(x.get("tools"), list)
        ):
            return False
        return all(isinstance(m, dict) and m.get("role") in _ROLES for m in x["messages"]) and all(
            isinstance(t, dict) for t in x["tools"]
        )

    def sample(self, mask: Any = None, probability: Any = None) -> dict:
        words = ["".join(self.np_random.choice(list(string.ascii_lowercase), size=5)) for _ in range(4)]
        return {"messages": [{"role": "user", "content": " ".join(words)}], "tools": []}

    def __repr__(self) -> str:
        return "Chat()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Chat)


class Completion(spaces.Space[Any]):
    """Action space of pivot envs: completion text (str) or an assistant message dict."""

    def __init__(self, max_length: int = 256, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_length = max_length
        self._charset = np.array(list(string.ascii_letters + string.digits + string.punctuation + " \n"))

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        return isinstance(x, dict) and x.get("role", "assistant") == "assistant"

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        length = int(self.np_random.integers(1, self.max_length + 1))
        return "".join(self.np_random.choice(self._charset, size=length))

    def __repr__(self) -> str:
        return f"Completion(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Completion) and other.max_length == self.max_length


SHARED_OBSERVATION_BYTES = 4 << 20  # per env in AsyncVectorEnv's shared memory; prefixes are far smaller


class ObservationTooLargeError(PivotEnvsError, ValueError):
    """A pivot's observation that does not fit its env's slot in AsyncVectorEnv's shared memory."""


class SharedChatBatch(Sequence):
    """The observations of an AsyncVectorEnv, read from shared memory when accessed.

    AsyncVectorEnv reads its shared memory once and expects in-place updates; each slot here
    is a byte buffer holding the latest observation as JSON, decoded on access (and by
    `deepcopy`, which AsyncVectorEnv applies when `copy=True`, the default).
    """

    def __init__(self, buffers: list[Any]) -> None:
        self._buffers = buffers

    def __len__(self) -> int:
        return len(self._buffers)

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        buffer = self._buffers[index]
        size = int.from_bytes(bytes(buffer[:8]), "little")
        return json.loads(bytes(buffer[8 : 8 + size]).decode("utf-8", "surrogatepass")) if size else None

    def __deepcopy__(self, memo: dict) -> tuple:
        return tuple(self)

    def __repr__(self) -> str:
        return f"SharedChatBatch({list(self)!r})"


def _create_shared_memory(space: Chat, n: int = 1, ctx: Any = mp) -> list[Any]:
    return [ctx.Array("B", SHARED_OBSERVATION_BYTES, lock=False) for _ in range(n)]


def _write_to_shared_memory(space: Chat, index: int, value: Any, shared_memory: list[Any]) -> None:
    # surrogatepass: a pivot's prefix may hold a lone surrogate (a \ud800 escape in its JSON); it must survive the trip
    data = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if len(data) + 8 > SHARED_OBSERVATION_BYTES:
        raise ObservationTooLargeError(
            f"observation of {len(data)} bytes exceeds the shared-memory slot of {SHARED_OBSERVATION_BYTES} bytes; "
            "use gym.make_vec(..., vector_kwargs={'shared_memory': False})"
        )
    buffer = shared_memory[index]
    buffer[8 : 8 + len(data)] = data
    buffer[:8] = len(data).to_bytes(8, "little")


def _register_vector_support() -> None:
    """Batch our spaces as tuples, like gymnasium does for Text and Graph (iteration then falls back to
    `iter(items)` over the batch, which is what we want)."""
    for space_type in (Chat, Completion):
        vector_utils.batch_space.register(space_type)(
            lambda space, n=1: spaces.Tuple([space] * n, seed=space.np_random)
        )
        vector_utils.concatenate.register(space_type)(lambda space, items, out: tuple(items))
        vector_utils.create_empty_array.register(space_type)(
            lambda space, n=1, fn=np.zeros: tuple(None for _ in range(n))
        )
    vector_utils.create_shared_memory.register(Chat)(_create_shared_memory)
    vector_utils.write_to_shared_memory.register(Chat)(_write_to_shared_memory)
    vector_utils.read_from_shared_memory.register(Chat)(
        lambda space, shared_memory, n=1: SharedChatBatch(shared_memory)
    )


_register_vector_support()
