"""Fixtures for the SWE domain's tests: real sandboxes (see tests/sandbox_fixtures.py) and the
tiny repository of swe_helpers.py with one pivot per expert turn."""

from __future__ import annotations

import pytest
from sandbox_fixtures import FAST_LIMITS, backend, has_bwrap, has_docker, kind, rootfs, sandbox
from swe_helpers import EXPERT_CALLS, OPS, TESTS, calc_pivot

from pivot_envs.domains.swe.repo import RepoSpec
from pivot_envs.pivot import Pivot

__all__ = ["FAST_LIMITS", "backend", "has_bwrap", "has_docker", "kind", "rootfs", "sandbox"]


@pytest.fixture(scope="session")
def calc_repo(tmp_path_factory) -> RepoSpec:
    """The tiny repository, as a directory RepoSpec."""
    root = tmp_path_factory.mktemp("calc-src")
    (root / "calc").mkdir()
    (root / "calc" / "__init__.py").write_text("")
    (root / "calc" / "ops.py").write_text(OPS)
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "test_ops.py").write_text(TESTS)
    return RepoSpec(name="calc", archive=str(root), sources=("calc/ops.py",))


@pytest.fixture(scope="session")
def calc_pivots(calc_repo) -> list[Pivot]:
    """One pivot per expert turn (t0 grep, t1 view, t2 edit, t3 test run, t4 submit)."""
    return [calc_pivot(calc_repo, turn) for turn in range(len(EXPERT_CALLS))]
