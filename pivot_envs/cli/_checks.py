"""Checks of a command's inputs that run before any work starts: no model is loaded, no env built.

An unknown env id, domain or verifier, an input file with no pivots, or an output path under a
regular file is reported here, in one line naming the input, instead of after minutes of work.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pivot_envs.config import ConfigError
from pivot_envs.errors import MissingExtraError, PivotEnvsError, UnknownNameError
from pivot_envs.pivot import Pivot, PivotFormatError, PivotWriteError, domain_mismatch

if TYPE_CHECKING:
    from pivot_envs.formats import ReadReport

log = logging.getLogger(__name__)


class OutputPathError(PivotEnvsError, ValueError):
    """An output path that cannot be written: a parent is a regular file, or the path is a directory."""


class FileAccessError(PivotEnvsError, OSError):
    """An input that cannot be read or an output that cannot be written (missing, no permission, disk full)."""


@contextlib.contextmanager
def file_errors(path: str | os.PathLike[str], flag: str = "") -> Iterator[None]:
    """Turn an OSError while reading or writing `path` into a FileAccessError naming it (and its flag)."""
    try:
        yield
    except FileAccessError:
        raise
    except PivotWriteError as error:  # its message names the file already
        raise FileAccessError(f"{flag} {error}" if flag else str(error)) from error
    except OSError as error:
        where = f"{flag} {path}" if flag else str(path)
        raise FileAccessError(f"{where}: {error.strerror or error}") from error


def known_domains() -> dict[str, str]:
    """The installed domains by name, each with the entry point value (`module:ATTR`) of its spec."""
    from pivot_envs.registry import discover

    return {name: entry_point.value for name, entry_point in discover().items()}


class PolicyLoadError(PivotEnvsError, OSError):
    """A policy whose weights or tokenizer cannot be loaded (a wrong path or model name)."""


def load_named_policy(spec: str, **options: object) -> object:
    """`load_policy(spec, **options)`, with a file the backend cannot find or read (an OSError)
    reported as a PolicyLoadError naming --policy."""
    from pivot_envs.policy import load_policy

    try:
        return load_policy(spec, **options)
    except OSError as error:
        raise PolicyLoadError(f"--policy {spec}: cannot load it: {error}") from error


def policy_options(
    device: str | None = None, max_prompt_tokens: int = 0, dtype: str | None = None
) -> dict[str, object]:
    """The options of a local policy backend (hf, vllm) a command line gave: `device` and `dtype`
    when set, and `max_prompt_tokens` when above 0 (0: whole prompts). A negative budget or a dtype
    not in `options.DTYPES` is a ConfigError naming it."""
    from pivot_envs.cli.options import check_dtype

    if max_prompt_tokens < 0:
        raise ConfigError(f"--max-prompt-tokens {max_prompt_tokens}: must be >= 0 (0: whole prompts)")
    given = {"device": device, "dtype": check_dtype(dtype)}
    options: dict[str, object] = {name: value for name, value in given.items() if value}
    return options | ({"max_prompt_tokens": max_prompt_tokens} if max_prompt_tokens else {})


def check_profiled(pivots: Iterable[Pivot]) -> None:
    """Raise PivotFormatError naming the first pivot without a profile (filtering D_adv needs one)."""
    for pivot in pivots:
        if pivot.profile is None:
            raise PivotFormatError(
                f"pivot {pivot.id} has no profile: profile it first (pivotrl profile) or use --mode cand"
            )


def check_domain(name: str) -> str:
    """`name` when it is an installed domain, else UnknownNameError with a 'did you mean'."""
    domains = known_domains()
    if name not in domains:
        raise UnknownNameError("domain", name, domains)
    return name


def check_env_id(env: str) -> str:
    """`env` when gymnasium knows it (after `import pivot_envs`), else UnknownNameError listing ours."""
    import gymnasium as gym

    import pivot_envs

    gym.register_envs(pivot_envs)
    if env not in gym.registry:
        raise UnknownNameError("env id", env, [name for name in gym.registry if name.startswith("pivot/")])
    return env


def _domain_spec(env: str) -> object | None:
    """The DomainSpec of an installed domain whose env id is `env`, or None (another env).

    Imports the domain's module; builds no env, which could start sandboxes.
    """
    from importlib.metadata import EntryPoint

    from pivot_envs.registry import GROUP, env_id, load_domain

    for name, value in known_domains().items():
        if env_id(name) == env:
            return load_domain(EntryPoint(name=name, value=value, group=GROUP))
    return None


def verifier_names(env: str) -> list[str] | None:
    """The verifier names a registered pivot env accepts (its class's `verifiers` table), or None
    when `env` is not one of the installed domains' ids (then the env alone can tell)."""
    spec = _domain_spec(env)
    if spec is None:
        return None
    table = getattr(spec.env_class, "verifiers", None)
    return sorted(table) if isinstance(table, dict) else sorted(spec.verifiers)


def check_scoring(pivots: Iterable[Pivot], env: str | None = None, verifier: str | None = None) -> list[str]:
    """Check the envs that will score `pivots` (`env`, else pivot/<domain>-v0 of each pivot's
    domain) and that each accepts `verifier`; returns the env ids. Raises UnknownNameError.
    Pivots of another domain than `env`'s are scored by it all the same, with a warning."""
    from pivot_envs.registry import env_id

    pivots = list(pivots)
    if env:
        envs = [check_env_id(env)]
        spec = _domain_spec(env)
        mismatch = domain_mismatch(pivots, getattr(getattr(spec, "env_class", None), "domain", ""))
        if mismatch:
            log.warning("--env %s: %s", env, mismatch)
    else:
        domains = sorted({pivot.domain for pivot in pivots})
        if "" in domains:
            unnamed = next(pivot.id for pivot in pivots if not pivot.domain)
            raise PivotFormatError(f"pivot {unnamed} has no domain: pass the env that scores it (--env)")
        envs = [check_env_id(env_id(check_domain(domain))) for domain in domains]
    if verifier:
        for scoring in envs:
            names = verifier_names(scoring)
            if names is not None and verifier not in names:
                raise UnknownNameError(f"{scoring} verifier", verifier, names)
    return envs


def check_output(path: str | os.PathLike[str], flag: str = "--out", directory: bool = False) -> Path:
    """`path` as a Path when it can be created: no parent of it is a regular file, and it is not
    a directory (a file output) or a regular file (a `directory` output). Raises OutputPathError."""
    path = Path(path)
    if path.exists() and path.is_dir() != directory:
        kind = "a directory" if path.is_dir() else "a regular file"
        raise OutputPathError(f"{flag} {path}: it is {kind}, not {'a directory' if directory else 'a file'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"{flag} {path}: {parent} is a regular file, not a directory")
            break
    return path


def check_plotting(what: str) -> None:
    """Raise MissingExtraError naming the `plot` extra when matplotlib is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise MissingExtraError(what, "matplotlib", "plot")


def read_input(
    path: str | os.PathLike[str], domain: str = "", report: ReadReport | None = None
) -> list[Pivot]:
    """The pivots of an input file (any format `pivot_envs.formats` reads), malformed records
    logged as warnings ("file:line: reason") and skipped; `report` receives the counts.

    Raises PivotFormatError naming the file when it holds no pivot: empty, or every record
    malformed (the first problem named, with its line or byte).
    """
    from pivot_envs.formats import ReadReport, read_as_pivots

    report = report if report is not None else ReadReport()
    with file_errors(path):
        pivots = read_as_pivots(path, domain=domain, report=report)
    for problem in report.problems:
        log.warning("%s", problem)
    if not pivots:
        raise no_pivot_error(str(path), report)
    return pivots


def no_pivot_error(where: str, report: ReadReport) -> PivotFormatError:
    """The error of an input that gave no pivot, saying why: empty, unreadable or every record
    malformed (the first problem named, with its line or byte), or no assistant turn to make a
    candidate of."""
    from pivot_envs.formats.records import CUT_OFF

    if report.skipped_total:
        malformed = report.skipped_total - report.skipped.get(CUT_OFF, 0)
        counted = f"{malformed} of {report.records} records malformed; " if report.records else ""
        return PivotFormatError(f"{where}: no pivot could be read ({counted}first: {report.problems[0]})")
    if not report.records:
        return PivotFormatError(f"{where}: the input is empty (no records)")
    return PivotFormatError(
        f"{where}: no pivot in {report.records} records (no assistant turn, or all filtered out)"
    )
