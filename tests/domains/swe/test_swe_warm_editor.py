"""The editor started ahead in each warm fork, bubblewrap and Docker (tools.EDITOR_WARM_UP): the
fork's editor call is answered by it, with the text a fresh editor gives, the file edited in place
and seen by the manifest (with the snapshot's digests reused), and a later call, or a call after
the warm editor was killed, starts an editor of its own."""

from __future__ import annotations

import hashlib

import pytest
from swe_helpers import EXPERT_CALLS, FIX_NEW, FIX_OLD

from pivot_envs.domains.swe import SweEnv, execute_call
from pivot_envs.domains.swe.tools import EDITOR_HOME, EDITOR_WARM

VIEW = EXPERT_CALLS[1]
EDIT = EXPERT_CALLS[2]


@pytest.fixture(params=["bwrap", "docker"])
def env(request, calc_pivots):
    request.getfixturevalue("has_bwrap" if request.param == "bwrap" else "has_docker")
    made = SweEnv(calc_pivots, sandbox=request.param, warm_pool=1)
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


def test_the_manifest_after_a_warm_edit_shows_the_new_file_and_reuses_the_other_digests(env):
    sandbox = warm_fork(env)
    inode = sandbox.run("stat -c %i /repo/calc/ops.py").output
    assert sandbox.known is not None and "calc/ops.py" in sandbox.known.files
    result = execute_call(sandbox, *EDIT)
    assert sandbox.run("stat -c %i /repo/calc/ops.py").output == inode  # written in place
    written = sandbox.run("cat /repo/calc/ops.py").output
    before = env._state.before
    assert result.files["calc/ops.py"] == " ".join(
        [*before["calc/ops.py"].split()[:2], hashlib.md5(written.encode()).hexdigest()]
    )
    assert {p: e for p, e in result.files.items() if p != "calc/ops.py"} == {
        p: e for p, e in before.items() if p != "calc/ops.py"
    }


def test_a_refused_call_through_the_warm_editor_keeps_its_category(env):
    sandbox = warm_fork(env)
    result = execute_call(sandbox, "str_replace_editor", {"command": "view", "path": "/etc/passwd"})
    assert (result.error, result.exit_code) == ("outside_repo", 1)


def test_a_call_after_the_warm_editor_was_killed_starts_its_own(env):
    sandbox = warm_fork(env)
    killed = f"p=$(cat {EDITOR_WARM}/pid); kill -9 $p; for i in $(seq 100); do [ -e /proc/$p/fd/0 ] || break; sleep 0.05; done"
    assert sandbox.run(killed).ok
    result = execute_call(sandbox, *VIEW, timeout=10)
    assert result.error is None and "def mean(values):" in result.text


def test_a_call_after_the_warm_editor_was_stopped_starts_its_own(env):
    # A stopped editor still has its fd/0 and would take the request, then never answer.
    sandbox = warm_fork(env)
    assert sandbox.run(f"kill -STOP $(cat {EDITOR_WARM}/pid)").ok
    result = execute_call(sandbox, *VIEW, timeout=10)
    assert result.error is None and "def mean(values):" in result.text
    assert waiting(sandbox)  # the stopped one was not written to


# Waits on the warm editor's FIFO as the editor does, with SIGTERM blocked: once sent, the signal
# stays pending and the process alive and waiting, as a killed editor is until it runs to exit.
SIGNALLED_STAND_IN = (
    "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}); "
    f"open('{EDITOR_WARM}/in').read()"
)


def test_a_call_right_after_the_warm_editor_was_signalled_starts_its_own(env):
    # kill returns once the signal is queued; a call made before the editor runs to exit sees it
    # alive, with its fd/0, and must not write to it (it waited out its timeout, graded timeout).
    sandbox = warm_fork(env)
    gone = f"p=$(cat {EDITOR_WARM}/pid); kill -9 $p; while [ -e /proc/$p/fd/0 ]; do sleep 0.05; done"
    assert sandbox.run(gone, timeout=10).ok
    stand_in = (
        f"python3 -I -S -c {SIGNALLED_STAND_IN!r} </dev/null >/dev/null 2>&1 & echo $! > {EDITOR_WARM}/pid;"
        " until grep -q '^State:.S' /proc/$!/status; do sleep 0.05; done; sleep 0.2; kill -TERM $!;"
        " grep -q '^ShdPnd:.0*4000$' /proc/$!/status"
    )
    assert sandbox.run(stand_in, timeout=10).ok  # alive, waiting, SIGTERM pending
    result = execute_call(sandbox, *VIEW, timeout=10)
    assert result.error is None and "def mean(values):" in result.text


def test_editor_calls_carry_no_editor_source_and_a_sandbox_without_the_editor_gets_it_once(sandbox):
    sent = []
    run = sandbox.run
    sandbox.run = lambda command, *args, **kwargs: sent.append(command) or run(command, *args, **kwargs)
    create = {"command": "create", "path": "/app/a.py", "file_text": "x = 1\n"}
    assert execute_call(sandbox, "str_replace_editor", create, workdir="/app").error is None
    view = execute_call(
        sandbox, "str_replace_editor", {"command": "view", "path": "/app/a.py"}, workdir="/app"
    )
    assert view.error is None and "x = 1" in view.text
    assert sandbox.run(f"[ -f {EDITOR_HOME}/swe_editor.py ]").ok
    # The create (told the editor is missing), the install, the create again, the view, the check.
    assert len(sent) == 5
    assert [command for command in sent if "def str_replace(" in command] == [sent[1]]
