"""`pivotrl sandbox`: build the terminal domain's base image, and remove leftover sandboxes.

    pivotrl sandbox build-image   # debootstrap root filesystem (+ docker import when a daemon answers); idempotent
    pivotrl sandbox gc            # remove containers, snapshot images, bubblewrap sandboxes and directories of dead processes
    pivotrl sandbox gc --all      # ... of every process, this one's included (and --base: the base image too)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pivot_envs.config import add_options, from_args, option

NAME = "sandbox"
HELP = "build the terminal sandbox base image (build-image) or remove leftover sandboxes (gc)"


@dataclass
class GcConfig:
    """What `pivotrl sandbox gc` removes."""

    all: bool = option(False, "remove the sandboxes of live processes too, not only of processes that are gone")
    base: bool = option(False, "also remove the base image (rebuilt from the cached root filesystem in seconds)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.domains.terminal.image import ImageConfig

    actions = parser.add_subparsers(dest="sandbox_action", metavar="ACTION", required=True)
    build = actions.add_parser("build-image", help="build the Debian base root filesystem and Docker image (idempotent)")
    add_options(build, ImageConfig)
    gc = actions.add_parser("gc", help="remove labelled containers/images and bubblewrap sandboxes/directories left behind")
    add_options(gc, GcConfig)


def main(args: argparse.Namespace) -> int:
    if args.sandbox_action == "build-image":
        from pivot_envs.domains.terminal.image import ImageConfig, build_image

        rootfs, tag = build_image(from_args(ImageConfig, args))
        print(f"root filesystem: {rootfs}")
        print(f"docker image:    {tag or '(not built: no Docker daemon answers)'}")
        return 0
    from pivot_envs.sandboxes.cleanup import gc

    config = from_args(GcConfig, args)
    removed = gc(include_base=config.base, all_owners=config.all)
    print(", ".join(f"{count} {what}" for what, count in removed.items()) + " removed")
    return 0
