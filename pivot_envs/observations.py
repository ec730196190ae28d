"""Fresh copies of pivot observations, made fast.

An env hands out two copies of a pivot's observation per episode (reset's and step's), so that a
caller editing one changes nothing the env keeps. A copy is thawed from bytes frozen once per
pivot (marshal, with equal strings frozen as one object). A tool list is frozen once per env for
every pivot offering the same tools (a domain's tool set), and once it has been copied
`COMPILE_AFTER` times it is compiled into code that builds it: evaluating that code makes only
the dicts and lists, since its strings and numbers are the code's constants, shared by every copy
(0.6x the time of thawing the bundled tool-use tools, which are 137 dicts and lists).
"""

from __future__ import annotations

import ast
import marshal
import pickle
from collections.abc import Callable
from functools import partial
from typing import Any

from pivot_envs.pivot import Pivot

# Pivots whose observation an env keeps frozen (first in, first out): ~20 KB each on the bundled
# tool-use pivots; as many tool lists.
FROZEN_OBSERVATIONS = 512
# Copies of a tool list before it is compiled: compiling the bundled tools takes ~2 ms, which the
# faster copies earn back in about 200 copies.
COMPILE_AFTER = 256
_MAX_DEPTH = 64  # deeper values are frozen as they are (an observation may nest 10,000 levels)
_SCALARS = frozenset({str, int, float, bool, type(None)})
_NO_NAMES: dict[str, Any] = {"__builtins__": {}}  # the compiled code reads no name


def freeze(value: Any) -> tuple[Callable[[bytes], Any], bytes]:
    """Plain data as bytes and the function that makes a new copy of it: marshal where it can hold
    the data (dicts, lists, strings, numbers: 0.6x the time of pickle.loads), pickle otherwise.
    Equal strings are frozen as one, so a copy makes (and later frees) each string once: tool
    schemas repeat "string", "object" and their descriptions (thawing the bundled tool-use
    observations then takes 0.8x the time)."""
    value = _one_string_each(value, {}, 0)
    try:
        return marshal.loads, marshal.dumps(value)
    except ValueError:  # a type marshal cannot hold (a numpy value, an object)
        return pickle.loads, pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


def _one_string_each(value: Any, strings: dict[str, str], depth: int) -> Any:
    """`value` with its dicts and lists rebuilt so that equal strings are one object (the first
    seen); other values, and anything nested deeper than 64 levels, are kept as they are."""
    kind = type(value)
    if kind is str:
        return strings.setdefault(value, value)
    if depth >= _MAX_DEPTH:
        return value
    if kind is dict:
        return {
            _one_string_each(key, strings, depth): _one_string_each(item, strings, depth + 1)
            for key, item in value.items()
        }
    if kind is list:
        return [_one_string_each(item, strings, depth + 1) for item in value]
    return value


def compiled_copier(value: Any) -> Callable[[], Any] | None:
    """A function returning a new copy of `value` (plain JSON: dicts with string keys, lists,
    strings, numbers, booleans, None, at most 64 levels deep), built by code compiled from it with
    its strings and numbers as constants; None for any other value. No text is parsed: the code is
    compiled from a syntax tree of literals made from the value itself."""
    try:
        tree = ast.fix_missing_locations(ast.Expression(_literal(value, 0)))
        return partial(eval, compile(tree, "<frozen observation>", "eval"), _NO_NAMES)
    except (ValueError, RecursionError, MemoryError):
        return None


def _literal(value: Any, depth: int) -> ast.expr:
    """The literal expression that builds `value`; ValueError where it is not plain JSON."""
    kind = type(value)
    if kind in _SCALARS:
        return ast.Constant(value)
    if depth >= _MAX_DEPTH:
        raise ValueError("nested too deeply")
    if kind is list:
        return ast.List([_literal(item, depth + 1) for item in value], ast.Load())
    if kind is dict and all(type(key) is str for key in value):
        return ast.Dict(
            [ast.Constant(key) for key in value], [_literal(item, depth + 1) for item in value.values()]
        )
    raise ValueError(f"not plain JSON: {kind.__name__}")


class _FrozenTools:
    """One tool list, frozen, shared by the pivots offering it; compiled once copied often."""

    __slots__ = ("thaw", "data", "copies", "build")

    def __init__(self, thaw: Callable[[bytes], Any], data: bytes) -> None:
        self.thaw, self.data = thaw, data
        self.copies = 0
        self.build: Callable[[], Any] | None = None

    def copy(self) -> Any:
        if self.build is not None:
            return self.build()
        self.copies += 1
        if self.copies == COMPILE_AFTER:  # compiled from the frozen value: what every copy shows
            self.build = compiled_copier(self.thaw(self.data))
        return self.thaw(self.data)


class ObservationCopies:
    """An env's frozen observations: `copy(pivot)` returns a new {"messages", "tools"} of `pivot`,
    sharing no dict or list with it or with an earlier copy. Pivots are records: editing one in
    place after an env has shown it is not seen by that env."""

    def __init__(self) -> None:
        self._pivots: dict[int, tuple[Pivot, Callable[[bytes], Any], bytes, _FrozenTools]] = {}
        self._tools: dict[bytes, _FrozenTools] = {}  # by their frozen bytes: equal tool lists share one

    def copy(self, pivot: Pivot) -> dict[str, Any]:
        entry = self._pivots.get(id(pivot))
        if entry is None or entry[0] is not pivot:
            entry = self._freeze(pivot)
        _, thaw, messages, tools = entry
        return {"messages": thaw(messages), "tools": tools.copy()}

    def _freeze(self, pivot: Pivot) -> tuple[Pivot, Callable[[bytes], Any], bytes, _FrozenTools]:
        thaw, data = freeze(pivot.tools)
        tools = self._tools.get(data)
        if tools is None:
            tools = self._tools[data] = _FrozenTools(thaw, data)
        entry = self._pivots[id(pivot)] = (pivot, *freeze(pivot.messages), tools)
        for table in (self._pivots, self._tools):
            if len(table) > FROZEN_OBSERVATIONS:
                table.pop(next(iter(table)))
        return entry
