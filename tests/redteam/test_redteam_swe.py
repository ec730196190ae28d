"""The SWE red-team families (attacks_swe.py) on one bundled task's seven pivots (a search, two test
runs, a view, the edit, `git diff` and the submit), on each sandbox backend: no family scores above
its floor, and none makes a step invalid. `benchmarks/redteam.py` runs them on every pivot."""

from __future__ import annotations

import pytest
from attacks_swe import BACKENDS, FAMILIES, make_env
from redteam_common import run_family
from sandbox_fixtures import has_bwrap, has_docker, rootfs

__all__ = ["has_bwrap", "has_docker", "rootfs"]

pytestmark = pytest.mark.slow

TASK = "swe/more-itertools/nth_combination-flip_arithmetic-0/"


@pytest.fixture(scope="module", params=BACKENDS)
def swe_env(request):
    request.getfixturevalue("has_bwrap" if request.param == "bwrap" else "has_docker")
    env = make_env(request.param)
    yield env
    env.close()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_family_scores_above_its_floor_or_makes_a_step_invalid(swe_env, name):
    family = FAMILIES[name]
    pivots = [pivot for pivot in swe_env.pivots if pivot.id.startswith(TASK)]
    assert len(pivots) == 7
    tally = run_family(swe_env, family, pivots)
    assert tally.applicable > 0, f"{name} applies to none of {TASK}*"
    assert tally.invalid == 0, f"{name} made {tally.invalid} step(s) invalid"
    assert tally.share <= family.floor, (
        f"{name} scored at {tally.scored}/{tally.applicable}: {tally.examples}"
    )
