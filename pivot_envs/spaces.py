"""Gymnasium spaces for chat observations and completion actions.

`Chat` holds {"messages": [...], "tools": [...]} in the canonical chat form; `Completion` holds
what a policy produces: raw completion text, or an already-parsed assistant message dict. Both
are registered with gymnasium's vector utilities so `gym.make_vec` batches them as tuples.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import utils as vector_utils

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class Chat(spaces.Space[dict]):
    """Observation space of pivot envs: a chat prefix and the tools offered."""

    def __init__(self, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if not isinstance(x, dict) or not isinstance(x.get("messages"), list) or not isinstance(x.get("tools"), list):
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


def _register_vector_support() -> None:
    """Batch our spaces as tuples, like gymnasium does for Text and Graph."""
    for space_type in (Chat, Completion):
        vector_utils.batch_space.register(space_type)(lambda space, n=1: spaces.Tuple([space] * n, seed=space.np_random))
        vector_utils.concatenate.register(space_type)(lambda space, items, out: tuple(items))
        vector_utils.iterate.register(space_type)(lambda space, items: iter(items))
        vector_utils.create_empty_array.register(space_type)(
            lambda space, n=1, fn=np.zeros: tuple(None for _ in range(n))
        )


_register_vector_support()
