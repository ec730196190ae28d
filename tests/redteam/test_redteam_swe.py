"""The SWE red-team families (attacks_swe.py) on one bundled task's seven pivots (a search, two test
runs, a view, the edit, `git diff` and the submit), on each sandbox backend: no family scores above
its floor, and none makes a step invalid. `benchmarks/redteam.py` runs them on every pivot."""

from __future__ import annotations

from contextlib import closing

import pytest
from attacks_swe import BACKENDS, FAMILIES, make_env
from redteam_common import assert_held, open_env, run_family
from sandbox_fixtures import has_bwrap, has_docker, rootfs

__all__ = ["has_bwrap", "has_docker", "rootfs"]

pytestmark = pytest.mark.slow

TASK = "swe/more-itertools/nth_combination-flip_arithmetic-0/"


@pytest.fixture(scope="module", params=BACKENDS)
def swe_env(request):
    with closing(open_env(request, make_env, sandboxed=True)) as env:
        yield env


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_family_scores_above_its_floor_or_makes_a_step_invalid(swe_env, name):
    family = FAMILIES[name]
    pivots = [pivot for pivot in swe_env.pivots if pivot.id.startswith(TASK)]
    assert len(pivots) == 7
    assert_held(run_family(swe_env, family, pivots), name, family)
