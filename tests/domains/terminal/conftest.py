"""Fixtures: real sandboxes on the terminal domain's base image (see tests/sandbox_fixtures.py)."""

from sandbox_fixtures import FAST_LIMITS, backend, has_bwrap, has_docker, kind, rootfs, sandbox

__all__ = ["FAST_LIMITS", "backend", "has_bwrap", "has_docker", "kind", "rootfs", "sandbox"]
