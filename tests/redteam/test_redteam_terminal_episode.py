"""The terminal-episode red-team families (attacks_terminal_episode.py) on a sample of the bundled tasks,
on each sandbox backend: no one command passes a task's check without doing the task, and none makes an
episode invalid. `benchmarks/redteam.py` runs them on every task."""

from __future__ import annotations

from contextlib import closing

import pytest
from attacks_terminal_episode import BACKENDS, FAMILIES, make_env
from redteam_common import assert_held, open_env, run_family
from sandbox_fixtures import has_bwrap, has_docker, rootfs

__all__ = ["has_bwrap", "has_docker", "rootfs"]

pytestmark = pytest.mark.slow

# Checks of every kind: cmp, grep, a printed value, stat, git, a test builtin, python3.
SAMPLE = (
    "terminal/count-error-lines/t0",
    "terminal/unique-error-messages/t0",
    "terminal/sed-config-port/t0",
    "terminal/private-key-permissions/t0",
    "terminal/git-restore-file/t0",
    "terminal/extract-tar-archive/t0",
    "terminal/python-fix-bug/t0",
)


@pytest.fixture(scope="module", params=BACKENDS)
def episode_env(request):
    with closing(open_env(request, make_env, sandboxed=True)) as env:
        yield env


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_family_passes_a_check_or_makes_an_episode_invalid(episode_env, name):
    family = FAMILIES[name]
    pivots = [pivot for pivot in episode_env.pivots if pivot.id in SAMPLE]
    assert len(pivots) == len(SAMPLE)
    assert_held(run_family(episode_env, family, pivots), name, family, applicable=False)
