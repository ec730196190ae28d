"""Config dataclasses drive the CLI: every field is a flag with its default and help text.

Declare fields with `option(default, "help text")`; `add_options(parser, Config)` adds
`--field-name` flags, and `from_args(Config, args)` builds the config back, so flags,
defaults and `--help` never drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def option(default: Any = dataclasses.MISSING, help: str = "", *, choices: tuple | None = None, factory: Any = None) -> Any:
    """A dataclass field with a help text (and optional choices) for the generated CLI."""
    metadata = {"help": help, "choices": choices}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the scalar type, whether None is allowed) of a field annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return (args[0] if len(args) == 1 else str), True
    return annotation, False


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def add_options(parser: argparse.ArgumentParser, config_cls: type, exclude: tuple[str, ...] = ()) -> None:
    """Add one `--flag` per field of `config_cls` (positional fields excluded by name)."""
    hints = typing.get_type_hints(config_cls)
    group = parser.add_argument_group(config_cls.__name__)
    for field in dataclasses.fields(config_cls):
        if field.name in exclude or not field.init:
            continue
        kind, optional = _base_type(hints[field.name])
        default = field.default if field.default is not dataclasses.MISSING else None
        if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = field.default_factory()  # type: ignore[misc]
        help_text = field.metadata.get("help", "")
        flag = "--" + field.name.replace("_", "-")
        common: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS}
        # argparse %-formats help texts: a literal % in the text or the default must be doubled.
        shown = f"{help_text} (default: {default!r})".replace("%", "%%")
        if kind is bool:
            group.add_argument(flag, type=_parse_bool, nargs="?", const=True, metavar="BOOL", help=shown, **common)
        elif typing.get_origin(kind) in (list, tuple):
            (item,) = typing.get_args(kind)[:1] or (str,)
            group.add_argument(flag, type=item, nargs="*", help=shown, **common)
        else:
            caster = kind if kind in (int, float, str) else str
            group.add_argument(
                flag, type=caster, choices=field.metadata.get("choices"), help=shown, **common
            )
        _ = optional


def from_args(config_cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """Build `config_cls` from parsed args: fields given on the command line, defaults otherwise."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls) if f.init and hasattr(args, f.name)}
    values.update(overrides)
    return config_cls(**values)


def progress_disabled() -> bool | None:
    """tqdm's `disable` for the library's progress bars: True when the `pivot_envs` logger is set
    above INFO (`pivotrl -q`), else None (a bar shows when stderr is a terminal)."""
    return True if logging.getLogger("pivot_envs").level > logging.INFO else None
