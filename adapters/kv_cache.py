"""The name transformers gives a model's key/value cache, in `forward`'s arguments and its output.

transformers 5.2x renamed `past_key_values` to `cache` (the old name warns, and is to go in 5.40);
pyproject admits versions on both sides of the rename, so the callers that pass a cache or read one
back use whichever name the installed version has.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any


@functools.cache
def cache_name() -> str:
    """ "cache" where the installed transformers has the new name, else "past_key_values"."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    fields = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    return "cache" if "cache" in fields else "past_key_values"


def with_cache(cache: Any) -> dict[str, Any]:
    """The keyword argument passing `cache` to a model's forward: `model(ids, **with_cache(cache))`."""
    return {cache_name(): cache}


def cache_of(output: Any) -> Any:
    """The key/value cache a forward returned (with use_cache=True)."""
    return getattr(output, cache_name())
