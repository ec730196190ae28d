"""The library's exceptions: one base, `PivotEnvsError`, with typed children callers can catch.

Each child also keeps the built-in base it had before (ValueError, RuntimeError), so code that
caught those still works. The CLI prints a PivotEnvsError as one line naming the bad input and
exits non-zero; any other exception is a bug and shows its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PivotEnvsError(Exception):
    """Base of every error pivot-envs raises on purpose (bad input, missing part, failed backend)."""


class UnknownNameError(PivotEnvsError, ValueError):
    """A name (env id, domain, verifier, format, option) that is not one of the known ones."""

    def __init__(self, kind: str, name: str, choices: Iterable[str]) -> None:
        self.kind, self.name, self.choices = kind, name, sorted(choices)
        super().__init__(f"unknown {kind} {name!r}{did_you_mean(name, self.choices)}")


class PivotSetError(PivotEnvsError, ValueError):
    """A set of pivots that cannot be used as given (duplicate ids, no domain to pick an env by)."""


class MissingExtraError(PivotEnvsError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, what: str, module: str, extra: str) -> None:
        super().__init__(
            f"{what} needs {module!r}, which is not installed: pip install 'pivot-envs[{extra}]'"
        )
        self.name = module


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """'; did you mean 'x'? (choose from a, b, c)' for an unknown `name` among `choices`."""
    choices = sorted(choices)
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    listing = ", ".join(choices[:20]) + (", ..." if len(choices) > 20 else "")
    return f"{hint} (choose from {listing})" if choices else hint
