"""The editor started ahead in each warm bubblewrap fork (tools.EDITOR_WARM_UP): the fork's editor
call is answered by it, with the text a fresh editor gives, and a later call, or a call after the
warm editor was killed, starts an editor of its own."""

from __future__ import annotations

import pytest
from pivot_envs.domains.swe import SweEnv, execute_call
from pivot_envs.domains.swe.tools import EDITOR_WARM
from swe_helpers import EXPERT_CALLS, FIX_NEW, FIX_OLD

VIEW = EXPERT_CALLS[1]
EDIT = EXPERT_CALLS[2]


@pytest.fixture
def env(calc_pivots, has_bwrap):
    made = SweEnv(calc_pivots, sandbox="bwrap", warm_pool=1)
    made.reset(options={"index": 1})
    assert made.backend.wait_warm(made._state.snapshot)
    yield made
    made.close()


def warm_fork(env):
    """A fork from the warm pool, its editor waiting (the pool is refilled and waited for first)."""
    assert env.backend.wait_warm(env._state.snapshot)
    env.reset(options={"index": 1})
    return env.sandbox


def waiting(sandbox) -> bool:
    return sandbox.run(f"[ -p {EDITOR_WARM}/in ]").exit_code == 0


def test_the_warm_editor_answers_the_forks_first_call_as_a_fresh_editor_would(env):
    sandbox = warm_fork(env)
    assert waiting(sandbox)
    warm = execute_call(sandbox, *VIEW)
    assert not waiting(sandbox)  # it served this call and is gone
    fresh = execute_call(sandbox, *VIEW)
    assert (warm.error, warm.exit_code) == (None, 0)
    assert warm.text == fresh.text and "def mean(values):" in warm.text


def test_an_edit_through_the_warm_editor_changes_the_file_and_reports_it(env):
    sandbox = warm_fork(env)
    result = execute_call(sandbox, *EDIT)
    assert result.error is None and "has been edited" in result.text
    assert FIX_NEW in sandbox.run("cat /repo/calc/ops.py").output
    again = execute_call(sandbox, *EDIT)
    assert again.error == "old_str_not_found" and FIX_OLD.strip() in again.text


def test_a_refused_call_through_the_warm_editor_keeps_its_category(env):
    sandbox = warm_fork(env)
    result = execute_call(sandbox, "str_replace_editor", {"command": "view", "path": "/etc/passwd"})
    assert (result.error, result.exit_code) == ("outside_repo", 1)


def test_a_call_after_the_warm_editor_was_killed_starts_its_own(env):
    sandbox = warm_fork(env)
    assert sandbox.run(f"kill -9 $(cat {EDITOR_WARM}/pid)").ok
    result = execute_call(sandbox, *VIEW, timeout=10)
    assert result.error is None and "def mean(values):" in result.text
