"""`pivotrl sandbox`: build the terminal domain's base image, and remove leftover sandboxes.

    pivotrl sandbox build-image   # debootstrap root filesystem (+ docker import when a daemon answers); idempotent
    pivotrl sandbox gc            # remove containers, snapshot images, bubblewrap sandboxes and directories of dead processes
    pivotrl sandbox gc --all      # ... of every process, this one's included (and --base: the base image too)

The terminal domain's command: the entry point `sandbox` of the group `pivot_envs.commands` names
this module, so the core CLI knows no sandbox.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pivot_envs.config import add_config, command_parser, option

NAME = "sandbox"
HELP = "Build the terminal sandbox base image (build-image) or remove leftover sandboxes (gc)."


@dataclass
class GcConfig:
    """What `pivotrl sandbox gc` removes."""

    all: bool = option(False, "remove the sandboxes of live processes too, not only of processes that are gone")
    base: bool = option(False, "also remove the base image (rebuilt from the cached root filesystem in seconds)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.domains.terminal.image import ImageConfig

    actions = parser.add_subparsers(dest="sandbox_action", metavar="ACTION", required=True, parser_class=command_parser)
    build = actions.add_parser("build-image", help="build the Debian base root filesystem and Docker image (idempotent)")
    add_config(build, ImageConfig, "image")
    gc = actions.add_parser("gc", help="remove labelled containers/images and bubblewrap sandboxes/directories left behind")
    add_config(gc, GcConfig, "gc")


def main(args: argparse.Namespace) -> int:
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
