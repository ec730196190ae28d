"""Domain plugins: the entry-point group `pivot_envs.domains`, registered with gymnasium lazily.

An entry point `NAME = module:ATTR` registers the env id `pivot/NAME-v0`. The module is imported
by `gym.make`, not by `import pivot_envs`; at import time we only check that the module can be
found, and a broken plugin produces a warning that names it, never an import error.

The gymnasium entry point of `pivot/NAME-v0` is the string `pivot_envs.registry:domain[NAME]`
(resolved by this module's `__getattr__` when gym.make imports it), so an env's spec is plain
data: `env.spec.to_json()` works and `gym.make(EnvSpec.from_json(text))` builds the same env,
in this process or a fresh one.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import warnings
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import gymnasium as gym

from pivot_envs.env import PivotEnv
from pivot_envs.errors import PivotEnvsError, did_you_mean

GROUP = "pivot_envs.domains"
NAMESPACE = "pivot"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_ENTRY_POINT = re.compile(r"domain\[(?P<name>[a-z0-9][a-z0-9_-]*)\]")
_REGISTERED: dict[str, EntryPoint] = {}  # by domain name, what register_domains found


@dataclass
class DomainSpec:
    """What a domain plugin exposes through its entry point.

    name:         the domain name; the env id is `pivot/<name>-v0`.
    env_class:    a PivotEnv subclass; `gym.make` passes its keyword arguments to it.
    description:  one line for `pivotrl domains` and the docs.
    verifiers:    the verifier names the env accepts (informational; the env class decides).
    kwargs:       default keyword arguments of the env class (gym.make's override them).
    """

    name: str
    env_class: type
    description: str = ""
    verifiers: tuple[str, ...] = ("strict",)
    kwargs: dict[str, Any] = field(default_factory=dict)


class PluginError(PivotEnvsError, RuntimeError):
    """A domain plugin could not be loaded; the message names the plugin and the cause."""


def env_id(name: str) -> str:
    return f"{NAMESPACE}/{name}-v0"


def load_domain(entry_point: EntryPoint) -> DomainSpec:
    """Import a domain's module and return its DomainSpec (raises PluginError naming it)."""
    try:
        spec = entry_point.load()
    except Exception as error:
        raise PluginError(
            f"domain plugin {entry_point.name!r} ({entry_point.value}) failed to load: {error!r}"
        ) from error
    if not isinstance(spec, DomainSpec):
        raise PluginError(
            f"domain plugin {entry_point.name!r} ({entry_point.value}) is a {type(spec).__name__}, not a DomainSpec"
        )
    return spec


def make_domain_env(name: str, **kwargs: Any) -> gym.Env:
    """Build the env of the domain plugin `name` (loading the plugin) with `kwargs` over its defaults."""
    entry_point = _REGISTERED.get(name) or discover().get(name)
    if entry_point is None:
        raise PluginError(
            f"no domain plugin {name!r} is installed (entry-point group {GROUP!r})"
            f"{did_you_mean(name, [*_REGISTERED, *discover()])}"
        )
    spec = load_domain(entry_point)
    return spec.env_class(**{**spec.kwargs, **kwargs})


def __getattr__(attribute: str) -> Any:
    """`domain[NAME]`: the env factory of the domain NAME (what gym.make calls for `pivot/NAME-v0`)."""
    match = _ENTRY_POINT.fullmatch(attribute)
    if match is None:
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    return partial(make_domain_env, match["name"])


class SpecKwargs(dict):
    """The keyword arguments of a pivot env's gymnasium spec; they make same-step autoreset
    gym.make_vec's default.

    Under gymnasium's own default (next-step autoreset) every second vector step of a one-step
    env is spent on a reset that scores nothing (reward 0, no category), and nothing warns.
    gym.make_vec reads its vectorizer's options as `spec.kwargs.pop("vector_kwargs", <the
    caller's vector_kwargs>)` (gymnasium 1.4, the lowest we admit, sync and async alike); this dict answers that
    pop with the caller's options over `autoreset_mode=PivotEnv.metadata["autoreset_mode"]`, so a
    caller's own choice (autoreset_mode, shared_memory, ...) still wins. Otherwise a plain dict.
    """

    def pop(self, key: Any, *default: Any) -> Any:
        if key == "vector_kwargs" and key not in self:
            caller = default[0] if default and default[0] else {}
            return {"autoreset_mode": PivotEnv.metadata["autoreset_mode"].value, **caller}
        return super().pop(key, *default)


def _module_findable(value: str) -> bool:
    """Whether the entry point's module exists, found without running any package's code:
    `find_spec("a.b.c")` would import `a.b` (a domain package, for a domain's submodule), so the
    top-level package is found first and each further name is looked up in its parent's folder."""
    names = value.split(":", 1)[0].strip().split(".")
    try:
        spec = importlib.util.find_spec(names[0])
        for depth in range(1, len(names)):
            if spec is None or spec.submodule_search_locations is None:
                return False
            fullname = ".".join(names[: depth + 1])
            loaded = sys.modules.get(fullname)
            spec = (
                loaded.__spec__
                if loaded is not None
                else _find_spec(fullname, spec.submodule_search_locations)
            )
        return spec is not None
    except (ImportError, ValueError):
        return False


def _find_spec(fullname: str, path: Any) -> Any:
    """The import system's search for `fullname` in its parent's `path`, without importing the parent
    (every meta path finder is asked, as `import` would: an editable install maps folders by its own)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, list(path)) if find is not None else None
        if spec is not None:
            return spec
    return None


def discover() -> dict[str, EntryPoint]:
    """The domain entry points installed, by name (the first of duplicate names wins, with a warning)."""
    found: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=GROUP):
        if entry_point.name in found:
            if found[entry_point.name].value != entry_point.value:
                warnings.warn(
                    f"pivot-envs: domain plugin {entry_point.name!r} is defined twice "
                    f"({found[entry_point.name].value} and {entry_point.value}); keeping the first",
                    stacklevel=2,
                )
            continue
        found[entry_point.name] = entry_point
    return found


def register_domains() -> list[str]:
    """Register `pivot/<name>-v0` for every domain plugin found; returns the env ids registered."""
    registered = []
    for name, entry_point in discover().items():
        if not _NAME.match(name) or ":" not in entry_point.value:
            warnings.warn(
                f"pivot-envs: skipping domain plugin {name!r}: the entry point must be "
                f"'<lowercase-name> = module:attribute', got {name} = {entry_point.value}",
                stacklevel=2,
            )
            continue
        if not _module_findable(entry_point.value):
            warnings.warn(
                f"pivot-envs: domain plugin {name!r} is broken: module of {entry_point.value!r} cannot be found",
                stacklevel=2,
            )
            continue
        identifier = env_id(name)
        _REGISTERED[name] = entry_point
        if identifier not in gym.registry:
            gym.register(
                id=identifier,
                entry_point=f"{__name__}:domain[{name}]",
                kwargs=SpecKwargs(),
                max_episode_steps=None,
                disable_env_checker=False,
            )
        registered.append(identifier)
    return registered


def import_object(path: str) -> Any:
    """Import `module:attribute`."""
    module, _, attribute = path.partition(":")
    obj = importlib.import_module(module)
    for part in attribute.split(".") if attribute else []:
        obj = getattr(obj, part)
    return obj
