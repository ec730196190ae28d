"""Config dataclasses are the one source of every setting: the CLI, config files and the Python API
all read their defaults, help and allowed ranges from them.

Declare fields with `option(default, "help text")` and check them in `__post_init__` with
`at_least`, `between` and `one_of` (a `ConfigError` names the field and its allowed range). A
command adds a config to its parser with `add_config(parser, Config, dest)`; simple_parsing
(argparse underneath) makes one `--field-name VALUE` flag per field, booleans as `--flag` or
`--flag false`, and a config holding other configs gives `--inner.field-name` flags. Every
command reads `--config FILE` (TOML, YAML or JSON: a table per config, named by its dest, plus the
command's other options), flags override the file, and `--print-config` writes the effective
settings in that layout (`read_config_file`, `apply_config_file`, `format_config`).

simple_parsing is imported only when a parser is built, so `import pivot_envs` stays light.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pivot_envs.errors import MissingExtraError, PivotEnvsError, UnknownNameError, did_you_mean

FILE_FORMATS = (".toml", ".yaml", ".yml", ".json")

C = TypeVar("C")  # a config dataclass


class ConfigError(PivotEnvsError, ValueError):
    """A setting outside its allowed range, of the wrong type, or a config file that cannot be read."""


class UnknownOptionError(ConfigError, UnknownNameError):
    """A setting's value or a config file's key that is not one of the known ones ('did you mean')."""


def option(
    default: Any = dataclasses.MISSING, help: str = "", *, choices: tuple | None = None, factory: Any = None
) -> Any:
    """A dataclass field with a help text (and optional choices) for the generated CLI."""
    metadata: dict[str, Any] = {"help": help}
    if choices is not None:
        metadata["choices"] = choices
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# -- validation ------------------------------------------------------------------------------------


def _fail(config: object, name: str, allowed: str) -> ConfigError:
    return ConfigError(f"{type(config).__name__}.{name} = {getattr(config, name)!r}: must be {allowed}")


def _number(config: object, name: str) -> float | None:
    value = getattr(config, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(config, name, "a number")
    return value


def json_object(value: dict[str, Any] | str, where: str) -> dict[str, Any]:
    """`value`, or the JSON object the text `value` holds ("" is {}); raises ConfigError naming `where`."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as error:
            raise ConfigError(f"{where} must be a JSON object: {error}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def config_of(config_cls: type[C], value: C | Mapping[str, Any] | None, what: str) -> C:
    """`value` as a `config_cls`: itself, one made from a dict of its fields (an unknown name is an
    UnknownOptionError naming `what`), or the defaults for None."""
    if value is None:
        return config_cls()
    if isinstance(value, config_cls):
        return value
    known = [field.name for field in dataclasses.fields(config_cls)]
    for name in value:
        if name not in known:
            raise UnknownOptionError(what, name, known)
    return config_cls(**value)


def at_least(config: object, low: float, *names: str) -> None:
    """Raise ConfigError unless each of `names` (None allowed) is a number >= `low`."""
    for name in names:
        value = _number(config, name)
        if value is not None and not value >= low:
            raise _fail(config, name, f">= {low}")


def between(
    config: object, name: str, low: float, high: float, *, open_low: bool = False, open_high: bool = False
) -> None:
    """Raise ConfigError unless `name` (None allowed) lies in the interval from `low` to `high`."""
    value = _number(config, name)
    if value is None:
        return
    above = value > low if open_low else value >= low
    below = value < high if open_high else value <= high
    if not (above and below):
        raise _fail(config, name, f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}")


def one_of(config: object, name: str, choices: Iterable[str]) -> None:
    """Raise UnknownOptionError (with a 'did you mean') unless `name` is one of `choices`."""
    value = getattr(config, name)
    if value not in tuple(choices):
        raise UnknownOptionError(f"{type(config).__name__}.{name}", value, choices)


# -- parsers ---------------------------------------------------------------------------------------


def command_parser(**kwargs: Any) -> argparse.ArgumentParser:
    """An argparse parser that can hold config dataclasses (simple_parsing's ArgumentParser, with
    dashed flags and `--inner.field` for nested configs); every `pivotrl` command uses one."""
    import simple_parsing

    class Formatter(simple_parsing.SimpleHelpFormatter):
        """argparse %-formats help texts: a literal % (as in '95% CI') is kept as it is. A flag without a type
        shows its name as the value (`--out OUT`, not `--out None`), and "(default: ...)" is added only where
        the help does not already say its default and the default is a value (not None or False)."""

        def _expand_help(self, action: argparse.Action) -> str:
            return self._get_help_string(action).replace("%(default)s", str(action.default))

        def _get_help_string(self, action: argparse.Action) -> str | None:
            text = action.help or ""
            if action.default is None or action.default is False or action.default == argparse.SUPPRESS:
                # simple_parsing writes "(default: %(default)s)" into a dataclass field's help itself
                return re.sub(r"\s*\(default: (%\(default\)s|None|False)\)", "", text)
            said = re.sub(r"\s*\(default: %\(default\)s\)", "", text)
            if "default" in said.lower():  # the help says its default in its own words
                return said
            return super()._get_help_string(action)

        def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
            return (
                action.dest.upper()
                if action.type is None
                else super()._get_default_metavar_for_optional(action)
            )

        def _get_default_metavar_for_positional(self, action: argparse.Action) -> str:
            return action.dest if action.type is None else super()._get_default_metavar_for_positional(action)

    class Parser(simple_parsing.ArgumentParser):
        _check_value = check_choice

        def _preprocessing(self, *args: Any, **kwargs: Any) -> None:
            super()._preprocessing(*args, **kwargs)
            # A config field unset (None) in its config's default is filled in by that config
            # (`pivotrl run`'s stages take the run's seed), not a value the user must give.
            for action in self._actions:
                if "." in action.dest and action.default is None and action.option_strings:
                    action.required = False

    # One setting for every parser: simple_parsing keeps these on a class, shared by all parsers.
    return Parser(
        add_option_string_dash_variants=simple_parsing.DashVariant.DASH,
        argument_generation_mode=simple_parsing.ArgumentGenerationMode.NESTED,
        nested_mode=simple_parsing.NestedMode.WITHOUT_ROOT,
        add_config_path_arg=False,
        formatter_class=Formatter,
        **kwargs,
    )


def check_choice(parser: argparse.ArgumentParser, action: argparse.Action, value: Any) -> None:
    """argparse's check of a value against an argument's choices, with a 'did you mean' (a method
    of our parsers: argparse calls `parser._check_value(action, value)`)."""
    if action.choices is not None and value not in action.choices:
        choices = [str(choice) for choice in action.choices]
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}{did_you_mean(str(value), choices)}")


def add_config(parser: argparse.ArgumentParser, config_cls: type, dest: str, default: Any = None) -> None:
    """Add one flag per field of `config_cls` to `parser` (a `command_parser`); the parsed config is
    `args.<dest>`, and a config file's table `[dest]` sets its defaults."""
    parser.add_arguments(config_cls, dest=dest, default=default)
    parser.__dict__.setdefault("pivot_configs", {})[dest] = default if default is not None else config_cls()


# -- config files ----------------------------------------------------------------------------------


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping in a TOML, YAML or JSON file (by its suffix). Raises ConfigError naming the file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FILE_FORMATS:
        raise UnknownOptionError(f"config file format of {path}", suffix or "(no suffix)", FILE_FORMATS)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--config {path}: {getattr(error, 'strerror', None) or error}") from None
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise MissingExtraError(f"--config {path}", "yaml", "yaml") from None
        parse, errors = (lambda text: yaml.safe_load(text) or {}), (ValueError, yaml.YAMLError)
    elif suffix == ".json":
        parse, errors = json.loads, (ValueError,)
    else:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        parse, errors = tomllib.loads, (ValueError,)
    try:
        values = parse(text)
    except errors as error:  # each parser's message carries the line and column; one line of it
        raise ConfigError(f"--config {path}: {' '.join(str(error).split())}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path}: expected a table of settings, got {type(values).__name__}")
    return values


def _check_type(where: str, value: Any, annotation: Any) -> None:
    """Raise ConfigError unless a file's `value` fits a field's type (ints pass as floats)."""
    origin = typing.get_origin(annotation)
    allowed = typing.get_args(annotation) if origin in (typing.Union, types.UnionType) else (annotation,)
    for kind in allowed:
        kind = typing.get_origin(kind) or kind
        if kind is type(None) and value is None:
            return
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if kind in (tuple, list) and isinstance(value, list):
            return
        if isinstance(kind, type) and kind is not type(None) and isinstance(value, kind):
            if kind is int and isinstance(value, bool):
                continue
            return
        if kind is Any:
            return
    names = " or ".join(getattr(typing.get_origin(k) or k, "__name__", str(k)) for k in allowed)
    raise ConfigError(f"{where} = {value!r}: must be {names}")


# Options a config file does not hold: help, the file itself, and the CLI's own verbosity counts.
SKIPPED = {"help", "config", "print_config", "verbose_after", "quiet_after"}


def apply_config_file(parser: argparse.ArgumentParser, values: Mapping[str, Any], path: str) -> None:
    """Make a config file's `values` the defaults of `parser`'s options (flags still override
    them). Keys may use dashes or underscores; an unknown key is an UnknownOptionError with a
    'did you mean', a value of the wrong type a ConfigError naming it."""
    configs = {dest: type(default) for dest, default in parser.__dict__.get("pivot_configs", {}).items()}
    plain = {
        action.dest: action
        for action in parser._actions
        if action.option_strings and action.dest not in SKIPPED
    }
    positional = {action.dest for action in parser._actions if not action.option_strings}
    tables: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name in positional:
            raise ConfigError(
                f"--config {path}: {key!r} is a positional argument: give it on the command line"
            )
        if name in configs and isinstance(value, Mapping):
            tables[name] = _table(configs[name], value, f"{path} [{key}]")
        elif configs and len(configs) == 1 and name in _fields(next(iter(configs.values()))):
            only = next(iter(configs))  # a flat file for a command with one config
            tables.setdefault(only, {}).update(_table(configs[only], {key: value}, path))
        elif name in plain:
            options[name] = value
            plain[name].required = False
        else:
            known = [*configs, *plain, *(_fields(next(iter(configs.values()))) if len(configs) == 1 else ())]
            raise UnknownOptionError(f"setting in {path}", str(key), known)
    parser.set_defaults(**options, **{dest: _merge(parser, dest, table) for dest, table in tables.items()})


def _fields(config_cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(config_cls) if f.init}


def _table(config_cls: type, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A file's table for `config_cls`, keys normalised and each value checked against its field."""
    fields, hints = _fields(config_cls), typing.get_type_hints(config_cls)
    table: dict[str, Any] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            raise UnknownOptionError(f"{config_cls.__name__} setting in {where}", str(key), fields)
        if dataclasses.is_dataclass(hints[name]) and isinstance(value, Mapping):
            table[name] = _table(hints[name], value, f"{where} [{key}]")
        else:
            _check_type(f"{where}: {key}", value, hints[name])
            table[name] = value
    return table


def _merge(parser: argparse.ArgumentParser, dest: str, table: dict[str, Any]) -> dict[str, Any]:
    """The file's table over the config's current default (a command's preset for nested configs)."""
    return _deep_update(dataclasses.asdict(parser.__dict__["pivot_configs"][dest]), table)


def _deep_update(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            base[key] = _deep_update(dict(base[key]), value)
        else:
            base[key] = value
    return base


def effective_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The settings a command runs with: its options, then its config's fields (each config as a
    table when it has several), as `format_config` writes them and `apply_config_file` reads them."""
    configs = parser.__dict__.get("pivot_configs", {})
    settings = {
        action.dest: getattr(args, action.dest)
        for action in parser._actions
        if action.dest not in SKIPPED
        and action.dest in vars(args)
        and action.dest not in configs
        and not isinstance(action, argparse._SubParsersAction)
    }
    if len(configs) == 1:  # a command with one config: its fields at the top, as in its flags
        settings.update(_values(getattr(args, next(iter(configs)))))
    else:
        settings.update({dest: getattr(args, dest) for dest in configs})
    return settings


def _values(config: Any) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None)
            + "}"
        )
    return json.dumps(str(value), ensure_ascii=False)


def _toml_key(key: str) -> str:
    return key if _BARE.match(key) else json.dumps(key)


def derived_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, tuple[Any, str]]:
    """The settings a command's configs leave unset for one of their own to fill in: a config with
    a `derived()` method (`pivotrl run`'s, whose stages follow its seed) names them, each with the
    value it takes and the setting that value comes from, by its path in `effective_settings`."""
    configs = parser.__dict__.get("pivot_configs", {})
    found: dict[str, tuple[Any, str]] = {}
    for dest in configs:
        derived = getattr(getattr(args, dest), "derived", None)
        if callable(derived):
            prefix = "" if len(configs) == 1 else f"{dest}."
            found.update({prefix + path: value for path, value in derived().items()})
    return found


def format_config(
    settings: Mapping[str, Any] | Any, table: str = "", derived: Mapping[str, tuple[Any, str]] | None = None
) -> str:
    """`settings` (options, and configs as dataclasses) as TOML that `--config` reads back:
    scalars first, then a table per config. TOML has no null: a setting that is None is written
    as a comment (left out of a file, a setting takes its default), with the value it takes and
    where that comes from when `derived` (by dotted path) names it."""
    if dataclasses.is_dataclass(settings):
        settings = _values(settings)
    derived = derived or {}
    lines, tables = [], []
    for key, value in settings.items():
        path = f"{table}.{key}" if table else key
        if dataclasses.is_dataclass(value):
            tables.append((key, value))
        elif value is None and path in derived:
            taken, source = derived[path]
            lines.append(f"# {_toml_key(key)} = {_toml_value(taken)}  (unset: {source})")
        elif value is None:
            lines.append(f"# {_toml_key(key)} = (none)")
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in tables:
        name = f"{table}.{_toml_key(key)}" if table else _toml_key(key)
        lines += ["", f"[{name}]", format_config(value, name, derived)]
    if derived and not table:
        lines.insert(0, DERIVED_NOTE)
    return "\n".join(lines).strip("\n")


# The first line of a printed config with derived settings: the precedence they follow.
DERIVED_NOTE = (
    "# A setting marked 'unset' takes the value shown, from the one named; set it here or by its flag."
)


def progress_disabled() -> bool | None:
    """tqdm's `disable` for the library's progress bars: True when the `pivot_envs` logger is set
    above INFO (`pivotrl -q`), else None (a bar shows when stderr is a terminal)."""
    return True if logging.getLogger("pivot_envs").level > logging.INFO else None


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    desc: str,
    unit: str,
    total: int | None = None,
    enabled: bool = True,
    terminal_only: bool = False,
    **options: Any,
) -> Any:
    """A tqdm progress bar on stderr: the one way the library makes its bars, so that `pivotrl -q`
    (`progress_disabled()`) silences every one.

    Off with `enabled=False` (a config's `progress`, or a rank other than the first). The long jobs'
    bars (profiling, SFT, GRPO, evaluation) also show when stderr is a file, so a log shows how far
    a run is; `terminal_only` keeps a short job's bar (reading, writing) off there.
    """
    from tqdm import tqdm

    if not enabled or progress_disabled():
        disable: bool | None = True
    else:
        disable = None if terminal_only else False
    options.setdefault("dynamic_ncols", True)
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, disable=disable, **options)
