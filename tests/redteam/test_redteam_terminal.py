"""The terminal red-team families (attacks_terminal.py) on a sample of the bundled pivots, on each sandbox
backend: no family scores above its floor, and none makes a step invalid. `benchmarks/redteam.py` runs
them on every pivot."""

from __future__ import annotations

from contextlib import closing

import pytest
from attacks_terminal import BACKENDS, FAMILIES, make_env
from redteam_common import assert_held, open_env, run_family
from sandbox_fixtures import has_bwrap, has_docker, rootfs

__all__ = ["has_bwrap", "has_docker", "rootfs"]

pytestmark = pytest.mark.slow

# Pivots of every kind: read-only, file-changing, shell state and .git only, globs, numbers, pipelines.
SAMPLE = (
    "terminal/count-error-lines/t2",
    "terminal/unique-error-messages/t1",
    "terminal/extract-tar-archive/t2",
    "terminal/git-init-commit/t0",
    "terminal/git-init-commit/t3",
    "terminal/top-ip-addresses/t2",
    "terminal/env-var-export/t1",
    "terminal/line-endings/t2",
)


@pytest.fixture(scope="module", params=BACKENDS)
def terminal_env(request):
    with closing(open_env(request, make_env, sandboxed=True)) as env:
        yield env


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_family_scores_above_its_floor_or_makes_a_step_invalid(terminal_env, name):
    family = FAMILIES[name]
    pivots = [pivot for pivot in terminal_env.pivots if pivot.id in SAMPLE]
    assert len(pivots) == len(SAMPLE)
    assert_held(run_family(terminal_env, family, pivots), name, family, applicable=False)
