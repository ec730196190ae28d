"""The tool-use domain's red team (issue 35, R8 and the call rules): no attack family scores above its
floor on either backend (the airline tools, recorded outputs), and none can make a step invalid. Runs
on every bundled pivot (about 10 s per backend); `benchmarks/redteam.py` runs the same."""

from __future__ import annotations

from contextlib import closing

import attacks_tool_use
import pytest
from attacks_tool_use import BACKENDS, FAMILIES, ONLY_ON, make_env
from redteam_common import assert_floors_documented, assert_held, open_env, run_family


@pytest.fixture(scope="module", params=BACKENDS)
def env(request):
    with closing(open_env(request, make_env)) as made:
        yield made


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_family_scores_above_its_floor_and_none_makes_a_step_invalid(env, name):
    family = FAMILIES[name]
    tally = run_family(env, family, env.pivots)
    if ONLY_ON.get(name, env.backend_choice) != env.backend_choice:
        assert tally.applicable == 0, f"{name} applies only on the {ONLY_ON[name]} backend"
        return
    assert_held(tally, name, family)


def test_every_family_with_a_floor_says_what_it_is_and_where_it_is_documented():
    assert_floors_documented(FAMILIES, attacks_tool_use.DOCS)
