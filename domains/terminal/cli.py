"""`pivotrl sandbox`: build the terminal domain's base image, and remove leftover sandboxes.

    pivotrl sandbox build-image   # debootstrap root filesystem (+ docker import when a daemon answers); idempotent
    pivotrl sandbox gc            # remove containers, snapshot images, bubblewrap sandboxes and directories of dead processes
    pivotrl sandbox gc --all      # ... of every process, this one's included (and --base: the base image too)
    pivotrl sandbox harbor TASK_DIR [--trajectory FILE] [--out pivots.jsonl] [--sandbox bwrap|docker] [--docker-build] [--validate]
                                  # a Harbor task directory: replay the trajectory (else the oracle), run its tests, write pivots

The terminal domain's command: the entry point `sandbox` of the group `pivot_envs.commands` names
this module, so the core CLI knows no sandbox.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pivot_envs.config import add_config, command_parser, option

NAME = "sandbox"
HELP = "Build the terminal sandbox base image (build-image), remove leftover sandboxes (gc), import Harbor tasks (harbor)."


@dataclass
class GcConfig:
    """What `pivotrl sandbox gc` removes."""

    all: bool = option(
        False, "remove the sandboxes of live processes too, not only of processes that are gone"
    )
    base: bool = option(
        False, "also remove the base image (rebuilt from the cached root filesystem in seconds)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.domains.terminal.image import ImageConfig

    actions = parser.add_subparsers(
        dest="sandbox_action", metavar="ACTION", required=True, parser_class=command_parser
    )
    build = actions.add_parser(
        "build-image", help="build the Debian base root filesystem and Docker image (idempotent)"
    )
    add_config(build, ImageConfig, "image")
    gc = actions.add_parser(
        "gc", help="remove labelled containers/images and bubblewrap sandboxes/directories left behind"
    )
    add_config(gc, GcConfig, "gc")
    replay = actions.add_parser(
        "replay-pivot-v1",
        help="replay each Pivot-v1 terminal row's prefix (pivotrl extract --format pivot-v1) in a bubblewrap "
        "sandbox of the base image and mark executable the rows whose commands exit as recorded",
    )
    replay.add_argument("pivots", help="the pivot JSONL that pivotrl extract --format pivot-v1 wrote")
    replay.add_argument("--out", required=True, help="write the pivots here, the replayable ones executable")
    replay.add_argument(
        "--row-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds one row's replay may take, all its commands together (default: 30)",
    )
    replay.add_argument(
        "--max-rows",
        type=int,
        default=None,
        metavar="N",
        help="replay at most N terminal rows (default: all)",
    )
    harbor = actions.add_parser(
        "harbor",
        help="replay a Harbor task directory's trajectory (else its oracle solution), "
        "run its tests before and after, and write terminal pivots (docs/harbor.md)",
    )
    harbor.add_argument(
        "task_dir", help="the Harbor task directory (task.toml, instruction.md, environment/, tests/)"
    )
    harbor.add_argument(
        "--trajectory",
        default=None,
        help="the agent's trajectory: ATIF trajectory.json, a JSON list of commands, or one command a line",
    )
    harbor.add_argument("--out", default=None, help="write the pivots (JSONL) here")
    harbor.add_argument(
        "--sandbox", default="bwrap", choices=("auto", "docker", "bwrap"), help="sandbox backend"
    )
    harbor.add_argument(
        "--docker-build",
        action="store_true",
        help="Docker: build environment/Dockerfile as an image and run in it (default: the Dockerfile "
        "replayed as set-up on the base image, which pivots replay on either backend)",
    )
    harbor.add_argument(
        "--validate",
        action="store_true",
        help="first validate the task directory and the ATIF trajectory with the harbor package's own loader "
        "and models (.venv-harbor, made by make setup; docs/harbor.md)",
    )


def harbor_main(args: argparse.Namespace) -> int:
    """`pivotrl sandbox harbor`: exit 0 iff the replay passes the task's tests and the untouched environment does not."""
    from pivot_envs.domains.terminal import harbor, image
    from pivot_envs.pivot import write_pivots
    from pivot_envs.sandboxes.backends import make_backend, resolve_sandbox
    from pivot_envs.sandboxes.protocol import SandboxError

    if args.validate:
        harbor.validate_with_harbor(args.task_dir, args.trajectory)
    task = harbor.load_task(args.task_dir)
    kind = resolve_sandbox(args.sandbox)
    if args.docker_build and kind != "docker":
        raise SandboxError(
            "--docker-build needs the Docker backend (--sandbox docker): bubblewrap has only the base image"
        )
    rootfs = image.base_rootfs(build=False)
    backend, _ = make_backend(kind, None, 0, rootfs, image.image_tag())
    try:
        built = harbor.build_environment(task) if args.docker_build else None
        run, pivots = harbor.harbor_pivots(backend, task, args.trajectory, built)
    finally:
        backend.close()
    before, after = run.check_before, run.check_after
    print(
        f"task {task.name}: workdir {task.workdir}, {len(task.setup)} set-up commands, "
        f"verifier timeout {task.verifier_timeout:g} s, sandbox {kind}{', image ' + built if built else ''}"
    )
    print(f"tests before: exit {before.exit_code}; after {len(run.results)} commands: exit {after.exit_code}")
    print(after.output[-1000:].rstrip())
    if args.out:
        print(f"wrote {write_pivots(pivots, args.out)} pivots to {args.out}")
    return 0 if run.solved and not before.ok else 1


def replay_main(args: argparse.Namespace) -> int:
    """`pivotrl sandbox replay-pivot-v1`: the pivots streamed through `mark_replayable`; prints the share executed."""
    from pivot_envs.cli._checks import check_output, file_errors
    from pivot_envs.domains.terminal.pivot_v1 import mark_replayable, replay_backend
    from pivot_envs.pivot import PivotWriter, iter_pivots

    check_output(args.out)
    backend = replay_backend()
    replayed = executable = written = 0
    try:
        with file_errors(args.out, "--out"), PivotWriter(args.out, append=False, fsync=False) as writer:
            marked = mark_replayable(
                iter_pivots(args.pivots), backend, row_timeout=args.row_timeout, max_rows=args.max_rows
            )
            for pivot in marked:
                replayed += "replayed" in pivot.context or "replay_failed" in pivot.context
                executable += "replayed" in pivot.context
                writer.write(pivot)
                written += 1
            writer.sync()
    finally:
        backend.close()
    share = f"{100 * executable / replayed:.1f}%" if replayed else "none replayed"
    print(f"terminal rows replayed in the base image: {replayed}, executed {executable} ({share})")
    print(f"pivots written: {written} -> {args.out}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.sandbox_action == "harbor":
        return harbor_main(args)
    if args.sandbox_action == "replay-pivot-v1":
        return replay_main(args)
    if args.sandbox_action == "build-image":
        from pivot_envs.domains.terminal.image import build_image

        rootfs, tag = build_image(args.image)
        print(f"root filesystem: {rootfs}")
        print(f"docker image:    {tag or '(not built: no Docker daemon answers)'}")
        return 0
    from pivot_envs.sandboxes.cleanup import gc

    removed = gc(include_base=args.gc.base, all_owners=args.gc.all)
    print(", ".join(f"{count} {what}" for what, count in removed.items()) + " removed")
    return 0
