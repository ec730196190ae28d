"""sandboxes.backends: the one place the sandboxed domains choose and make their backend."""

from __future__ import annotations

import pytest
from sandbox_fixtures import FAST_LIMITS

from pivot_envs.domains.terminal import image
from pivot_envs.errors import UnknownNameError
from pivot_envs.sandboxes.backends import make_backend, resolve_sandbox


def test_make_backend_gives_a_bubblewrap_backend_on_the_root_filesystem_with_the_limits(has_bwrap):
    backend, tag = make_backend("bwrap", FAST_LIMITS, 1, has_bwrap, image.image_tag())
    try:
        assert (backend.name, tag, backend.rootfs, backend.limits, backend.warm_pool) == (
            "bwrap",
            "",
            has_bwrap,
            FAST_LIMITS,
            1,
        )
        sandbox = backend.create()
        assert sandbox.run("echo hi").output == "hi\n"
        sandbox.close()
    finally:
        backend.close()


def test_make_backend_gives_a_docker_backend_on_the_imported_base_image(has_docker, rootfs):
    backend, tag = make_backend("docker", FAST_LIMITS, 0, rootfs, image.image_tag())
    try:
        assert (backend.name, tag, backend.limits) == ("docker", has_docker, FAST_LIMITS)
        sandbox = backend.create(tag, "/app")
        assert sandbox.run("pwd").output == "/app\n"
        sandbox.close()
    finally:
        backend.close()


def test_an_unknown_backend_kind_is_named_with_the_choices(rootfs):
    with pytest.raises(UnknownNameError, match="bwrp.*bwrap"):
        make_backend("bwrp", FAST_LIMITS, 0, rootfs, image.image_tag())
    with pytest.raises(UnknownNameError, match="dockr"):
        resolve_sandbox("dockr")
