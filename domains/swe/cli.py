"""`pivotrl swe`: make injected-bug tasks, and build expert pivots from tasks.

    pivotrl swe make-tasks [--repo SPEC.toml] [--count 24] --out tasks.jsonl   # inject bugs, find FAIL_TO_PASS
    pivotrl swe build --repo SPEC.toml --tasks tasks.jsonl --out pivots.jsonl  # run the expert, write pivots
    pivotrl swe build-sample [--check] [--only ID,...]                         # the bundled pivots

`build` runs the scripted expert on each task twice in a sandbox (bubblewrap or Docker) and
writes one pivot per assistant turn; it fails when a task's bug does not make its FAIL_TO_PASS
tests fail, the expert's fix does not make them and PASS_TO_PASS pass, or the two runs' outputs
differ. `build-sample` does that for the bundled tasks into the package's data; `--check`
compares with the shipped file instead of writing it (so the bundled data never goes stale).

The SWE domain's command: the entry point `swe` of the group `pivot_envs.commands` names this
module.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivot_envs.config import ConfigError, add_config, command_parser, option, progress_bar
from pivot_envs.errors import PivotEnvsError

if TYPE_CHECKING:
    from pivot_envs.pivot import Pivot

    from .repo import RepoSpec

NAME = "swe"
HELP = "Make injected-bug SWE tasks (make-tasks) and build expert pivots from them (build, build-sample)."
SANDBOXES = ("auto", "bwrap", "docker")


class SampleMismatchError(PivotEnvsError, RuntimeError):
    """`build-sample --check` found the shipped pivots differ from a fresh build."""


@dataclass
class MakeTasksConfig:
    """What `pivotrl swe make-tasks` does."""

    repo: str = option("", "repository spec (TOML, see docs/swe.md); empty: the bundled more-itertools")
    out: str = option("tasks.jsonl", "task file to write (JSONL)")
    count: int = option(24, "how many tasks to find (one per function)")
    seed: int = option(0, "seed of the order in which mutations are tried and of the PASS_TO_PASS sample")
    max_tries: int = option(600, "most mutations screened (each runs the repository's fast tests once)")


@dataclass
class BuildConfig:
    """What `pivotrl swe build` and `build-sample` do."""

    repo: str = option("", "repository spec (TOML); empty: the bundled more-itertools")
    tasks: str = option("", "task file (JSONL); empty: the bundled tasks")
    out: str = option("", "pivot file to write (.jsonl or .jsonl.gz); build-sample: the package's data")
    sandbox: str = option(
        "auto", "sandbox backend: auto (Docker when a daemon answers, else bubblewrap)", choices=SANDBOXES
    )
    only: str = option("", "build only these tasks: comma-separated task ids (empty: every task)")
    check: bool = option(False, "build-sample: compare with the shipped pivots instead of writing them")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(
        dest="swe_action", metavar="ACTION", required=True, parser_class=command_parser
    )
    make = actions.add_parser(
        "make-tasks", help="inject bugs into a repository and find the tests they break"
    )
    add_config(make, MakeTasksConfig, "make")
    build = actions.add_parser("build", help="run the scripted expert on tasks and write its pivots")
    add_config(build, BuildConfig, "build")
    sample = actions.add_parser(
        "build-sample", help="rebuild (or --check) the bundled pivots from the bundled tasks"
    )
    add_config(sample, BuildConfig, "build")


def _repo(spec: str) -> RepoSpec:
    from .repo import bundled_repo, read_repo_spec

    return read_repo_spec(spec) if spec else bundled_repo()


def _backend(kind: str) -> Any:
    from pivot_envs.domains.terminal.image import image_tag, rootfs_path
    from pivot_envs.sandboxes.backends import make_backend, resolve_sandbox

    return make_backend(resolve_sandbox(kind), None, 0, rootfs_path(), image_tag())[0]


def build_pivots(config: BuildConfig) -> list[Pivot]:
    """Run the expert twice on each selected task and return the pivots of the first run.

    Raises ExpertError (from the expert) when a task is not solved or its two runs differ.
    """
    from .expert import ExpertError, expert_pivots, run_expert, same_outputs
    from .tasks import bundled_tasks, read_tasks

    if config.repo and not config.tasks:
        raise ConfigError("--repo needs --tasks: the bundled tasks are for the bundled repository")
    repo = _repo(config.repo)
    tasks = read_tasks(config.tasks) if config.tasks else bundled_tasks()
    index = {task.id: number for number, task in enumerate(tasks)}
    only = [name.strip() for name in config.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in index]
    if unknown:
        from pivot_envs.errors import UnknownNameError

        raise UnknownNameError("task", unknown[0], index)
    chosen = [task for task in tasks if not only or task.id in only]
    pivots = []
    backend = _backend(config.sandbox)
    try:
        for task in progress_bar(chosen, desc="expert runs", unit=" tasks", terminal_only=True):
            first = run_expert(backend, task, repo, index[task.id])
            differs = same_outputs(first, run_expert(backend, task, repo, index[task.id]))
            if differs:
                raise ExpertError(f"task {task.id}: two runs of the expert differ at {differs}")
            pivots.extend(expert_pivots(first))
    finally:
        backend.close()
    return pivots


def check_sample(pivots: list[Pivot], shipped_path: Path, every_task: bool) -> None:
    """Raise SampleMismatchError unless the shipped file holds exactly these pivots for their tasks
    (and, when `every_task`, nothing else), equal up to unittest's timings and object addresses."""
    from pivot_envs.pivot import read_pivots

    from .expert import normalized_record

    shipped = {pivot.id: pivot for pivot in read_pivots(shipped_path)}
    built = {pivot.id: pivot for pivot in pivots}
    trajectories = {pivot.trajectory_id for pivot in pivots}
    expected = {i for i, p in shipped.items() if every_task or p.trajectory_id in trajectories}
    stale = sorted(expected ^ built.keys())
    if stale:
        raise SampleMismatchError(
            f"{shipped_path}: pivot {stale[0]} is {'not built' if stale[0] in shipped else 'not shipped'} "
            f"({len(stale)} differ): run `pivotrl swe build-sample`"
        )
    for name, pivot in built.items():
        if normalized_record(pivot) != normalized_record(shipped[name]):
            raise SampleMismatchError(
                f"{shipped_path}: pivot {name} differs from a fresh build: run `pivotrl swe build-sample`"
            )


def main(args: argparse.Namespace) -> int:
    if args.swe_action == "make-tasks":
        from .tasks import Discovery, make_tasks, write_tasks

        config: MakeTasksConfig = args.make
        discovery = Discovery()
        with progress_bar(total=config.count, desc="tasks found", unit="it", terminal_only=True) as bar:
            tasks = make_tasks(
                _repo(config.repo),
                config.count,
                config.seed,
                config.max_tries,
                progress=lambda found: bar.update(found - bar.n),
                discovery=discovery,
            )
        write_tasks(tasks, config.out)
        reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(discovery.rejected.items()))
        print(
            f"wrote {len(tasks)} tasks to {config.out} ({discovery.screened} mutations screened; rejected: {reasons})"
        )
        return 0
    from .expert import write_expert_data
    from .tasks import tasks_file

    build: BuildConfig = args.build
    pivots = build_pivots(build)
    if args.swe_action == "build-sample":
        shipped = tasks_file().with_name("pivots.jsonl.gz")
        if build.check:
            check_sample(pivots, shipped, every_task=not build.only)
            print(f"{len(pivots)} pivots match {shipped}")
            return 0
        out = Path(build.out) if build.out else shipped
    else:
        out = Path(build.out or "swe_pivots.jsonl")
    count = write_expert_data(pivots, out)
    print(f"wrote {count} pivots to {out}")
    return 0
