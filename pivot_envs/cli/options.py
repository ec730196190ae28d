"""The policy options every command takes, declared once: `--policy`, `--device`, `--dtype`,
`--max-prompt-tokens`.

`PolicyOptions` holds each option's help text; a hand-written parser gets the flags from
`add_policy_options`, a config dataclass (`pivotrl run`'s) its fields from `policy_field`, and
`pivotrl train` has `--policy` from `GRPOConfig`, whose field's help is `policy_help("policy")`. A
command keeps its own default (required, a value, or unset meaning "the scale's"); the help text is
the same everywhere. `check_dtype` is the one check of a `--dtype` value.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from pivot_envs.config import ConfigError, option
from pivot_envs.policy import SPEC_FORMS

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class PolicyOptions:
    """How a command loads its policy: the spec, then the options of a local backend (hf, vllm)."""

    policy: str | None = option(None, f"policy spec: {SPEC_FORMS}")
    device: str | None = option(None, "device of a local policy (hf, vllm): cpu, cuda")
    dtype: str | None = option(
        None,
        f"precision of a local policy's weights (hf, vllm): {', '.join(DTYPES)} (default: the backend's, "
        "float32 on a CPU)",
    )
    max_prompt_tokens: int = option(
        0,
        "prompt budget of a local policy: older turns, then the middle of long messages, are left out "
        "beyond it (0: whole prompts)",
    )


def check_dtype(dtype: str | None) -> str | None:
    """`dtype` when it is None or one of DTYPES, else a ConfigError naming it."""
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype}: must be one of {', '.join(DTYPES)}")
    return dtype


def _field(name: str) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(PolicyOptions)}[name]


def policy_help(name: str, default: str = "") -> str:
    """The help text of the option `name`, with what its default means in a command when it is
    not a plain value (`default`: "the scale's")."""
    text = _field(name).metadata["help"]
    return f"{text} (default: {default})" if default else text


def add_policy_options(
    parser: argparse.ArgumentParser, *names: str, required: bool = False, default: str = ""
) -> None:
    """Add the flags of `names` (fields of PolicyOptions) to `parser`: `--policy` required when
    `required`; `default` says what an option left unset means in this command."""
    for name in names:
        spec = _field(name)
        unset = spec.default is None
        arguments: dict[str, Any] = {
            "default": spec.default,
            "help": policy_help(name, default if unset else ""),
        }
        if isinstance(spec.default, int):
            arguments["type"] = int
        if name == "policy" and required:
            arguments["required"] = True
        parser.add_argument(f"--{name.replace('_', '-')}", **arguments)


def policy_field(name: str, default: Any, *, means: str = "") -> Any:
    """A config dataclass field for the option `name` with this config's `default` and the one
    help text (`means`: what an unset default stands for)."""
    return option(default, policy_help(name, means))
