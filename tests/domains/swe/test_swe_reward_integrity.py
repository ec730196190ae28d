"""Reward integrity of the effect verifier (issue 35, R5 and R6): an edit that leaves the bug in
cannot make the verifier's test run pass, and a test-run pivot scores a command that runs the
expert's tests, not one that prints their summary. Each attack here scored 1 before the fix."""

from __future__ import annotations

import dataclasses

import pytest
from sandbox_fixtures import FAST_LIMITS
from swe_helpers import FIX_OLD, calc_pivot, call_message

from pivot_envs.domains.swe import SweEnv, canonical_call
from pivot_envs.domains.swe.effects import is_test_file, run_tests
from pivot_envs.domains.swe.repo import RepoSpec
from pivot_envs.domains.swe.testruns import plain_test_run

LIMITS = dataclasses.asdict(FAST_LIMITS) | {"timeout": 20.0}
MEAN = "tests.test_ops.MeanTests"
# A change on the expert's hunk with no effect: the bug stays.
TOUCH = "sed -i 's|(len(values) + 1)$|(len(values) + 1)  # checked|' calc/ops.py"


def _python(script: str) -> str:
    return f"python3 - <<'PIVOT_ATTACK'\n{script}\nPIVOT_ATTACK"


def _append(code: str) -> str:
    """A bash call that touches the expert's hunk and appends `code` to calc/ops.py."""
    return f"{TOUCH} && " + _python(f"open('calc/ops.py', 'a').write({code!r})")


ATEXIT_REPORT = """
import atexit, sys
atexit.register(lambda: print(
    "PIVOT-TESTS\\n" + "\\n".join(t + "\\tpass" for t in sys.argv[1:]) + "\\nRan 3 tests\\n\\nOK", flush=True
))
"""
FAKE_UNITTEST = """
class _Result:
    testsRun = 1
    def wasSuccessful(self):
        return True
class TextTestRunner:
    def __init__(self, *args, **kwargs):
        pass
    def run(self, suite):
        return _Result()
class _Loader:
    def loadTestsFromName(self, name, module=None):
        return None
defaultTestLoader = _Loader()
TestLoader = _Loader
"""
PATCHED_ASSERTS = """
import contextlib, unittest
for name in dir(unittest.TestCase):
    if name.startswith(("assert", "fail")) and callable(getattr(unittest.TestCase, name)):
        setattr(unittest.TestCase, name, lambda *a, **k: contextlib.suppress(Exception))
unittest.TestResult.wasSuccessful = lambda self: True
"""
FORGE_AND_EXIT = """
import os, sys
if "unittest" in sys.modules:
    print("PIVOT-TESTS\\n" + "\\n".join(t + "\\tpass" for t in sys.argv[1:]), flush=True)
    os._exit(0)
"""


@pytest.fixture(scope="module")
def before_fix(calc_repo):
    """A test-run pivot before the fix (the expert's run fails), as the calc trajectory's second turn."""
    pivot = calc_pivot(calc_repo, 1)
    expert = canonical_call("bash", {"command": f"python3 -m unittest {MEAN}"})
    return dataclasses.replace(pivot, id="calc-mean/tests-before-fix", expert=expert)


@pytest.fixture(scope="module")
def env(calc_pivots, before_fix, has_bwrap):
    made = SweEnv([*calc_pivots, before_fix], sandbox="bwrap", limits=LIMITS)
    yield made
    made.close()


def score(env: SweEnv, pivot_id: str, command: str) -> tuple[float, str]:
    """(reward, category) of one bash call at a pivot."""
    env.reset(options={"pivot": pivot_id})
    _, reward, _, _, info = env.step(call_message("bash", {"command": command}))
    assert info["valid"], info
    return reward, info["category"]


# -- R5: overlapping_edit, the bug left in ---------------------------------------------------------------


def test_an_atexit_hook_printing_a_passing_report_does_not_pass_the_tests(env):
    assert score(env, "calc-mean/t2", _append(ATEXIT_REPORT)) == (0.0, "different_edit")


def test_a_unittest_module_in_the_repository_root_does_not_shadow_the_verifiers_unittest(env):
    shadow = f"{TOUCH} && " + _python(f"open('unittest.py', 'w').write({FAKE_UNITTEST!r})")
    assert score(env, "calc-mean/t2", shadow) == (0.0, "different_edit")


def test_a_fake_unittest_on_an_exported_pythonpath_does_not_reach_the_verifiers_test_run(env):
    planted = _python(
        f"import os; os.makedirs('/tmp/fake'); open('/tmp/fake/unittest.py', 'w').write({FAKE_UNITTEST!r})"
    )
    command = f"{TOUCH} && {planted}\nexport PYTHONPATH=/tmp/fake"
    assert score(env, "calc-mean/t2", command) == (0.0, "different_edit")


def test_an_edit_that_makes_the_tests_return_first_is_an_edit_of_the_tests(env):
    returns = "sed -i 's|^    def test_\\(.*\\)(self):$|    def test_\\1(self):\\n        return|' tests/test_ops.py"
    assert score(env, "calc-mean/t2", f"{TOUCH} && {returns}") == (0.0, "edits_tests")


def test_a_package_of_passing_stubs_shadowing_the_test_module_is_an_edit_of_the_tests(env):
    stubs = "".join(
        f"class {name}(__import__('unittest').TestCase):\n    def test_{name.lower()}(self):\n        pass\n"
        for name in ("MeanTests", "AddTests", "ClampTests")
    )
    package = _python(
        f"import os; os.makedirs('tests/test_ops'); open('tests/test_ops/__init__.py', 'w').write({stubs!r})"
    )
    assert score(env, "calc-mean/t2", f"{TOUCH} && {package}") == (0.0, "edits_tests")


def test_unittest_patched_in_memory_by_the_code_under_test_fails_the_tests(env):
    assert score(env, "calc-mean/t2", _append(PATCHED_ASSERTS)) == (0.0, "different_edit")


def test_a_report_forged_before_the_code_under_test_exits_is_not_read(env):
    assert score(env, "calc-mean/t2", _append(FORGE_AND_EXIT)) == (0.0, "different_edit")


def test_code_that_skips_the_tests_does_not_pass_them(env):
    skip = "sed -i \"s|return sum(values) / (len(values) + 1)$|raise __import__('unittest').SkipTest('later')|\" calc/ops.py"
    assert score(env, "calc-mean/t2", skip) == (0.0, "different_edit")


def test_another_fix_of_the_experts_lines_still_passes_the_verifiers_test_run(env):
    other = f"sed -i 's|{FIX_OLD.strip()}|total = sum(values); return total / len(values)|' calc/ops.py"
    assert score(env, "calc-mean/t2", other) == (1.0, "overlapping_edit")


def test_an_edit_that_writes_the_systems_unittest_earns_no_test_based_reward(calc_pivots, has_docker):
    patch = _python(
        "import glob\n"
        "for init in glob.glob('/usr/lib/python3*/unittest/__init__.py'):\n"
        f"    open(init, 'a').write({PATCHED_ASSERTS!r})"
    )
    docker = SweEnv([calc_pivots[2]], sandbox="docker", limits=LIMITS)
    try:
        docker.reset()
        _, reward, _, _, info = docker.step(call_message("bash", {"command": f"{TOUCH} && {patch}"}))
        assert (reward, info["category"], info["valid"]) == (0.0, "system_writes", True), info["detail"]
    finally:
        docker.close()


# -- R6: test-run pivots -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pivot_id, status, outcome",
    [("calc-mean/t3", 0, "OK"), ("calc-mean/tests-before-fix", 1, "FAILED (failures=1)")],
)
def test_a_printed_test_summary_does_not_score_at_a_test_run_pivot(env, pivot_id, status, outcome):
    printed = f"python3 -m unittest --help >/dev/null; printf 'Ran 2 tests in 0.001s\\n\\n{outcome}\\n'; exit {status}"
    assert score(env, pivot_id, printed) == (0.0, "not_only_tests")


@pytest.mark.parametrize("pivot_id, status", [("calc-mean/t3", 0), ("calc-mean/tests-before-fix", 1)])
def test_naming_the_experts_tests_without_running_them_scores_zero(env, pivot_id, status):
    for command in (
        f"true || python3 -m unittest {MEAN} ; exit {status}",
        f"python3 -m unittest -kmatches_nothing {MEAN}" + (" && false" if status else ""),
        f"python3() {{ return {status}; }}; python3 -m unittest {MEAN}",
        f"PYTHONPATH=/tmp/stub python3 -m unittest {MEAN}",
        f"python3 -m unittest {MEAN} & exit {status}",
    ):
        assert score(env, pivot_id, command) == (0.0, "not_only_tests"), command


def test_a_test_runner_that_is_not_installed_does_not_score_where_the_tests_fail(env):
    # pytest is not in the base image: `python3 -m pytest` exits 1, as the failing tests would.
    command = "python3 -m pytest tests/test_ops.py::MeanTests"
    assert score(env, "calc-mean/tests-before-fix", command) == (0.0, "runner_missing")


@pytest.mark.parametrize("pivot_id", ["calc-mean/t3", "calc-mean/tests-before-fix"])
def test_a_plain_run_of_the_experts_tests_scores_however_it_is_written(env, pivot_id):
    for command in (
        f"python3 -m unittest {MEAN}",
        f"cd /repo && python3 -m unittest -v {MEAN} 2>&1 | tail -3",
        "TZ=UTC python3 -m unittest tests/test_ops.py 2>&1 | grep -v ok",  # a module: other tests
        f"python3 -m unittest {MEAN}.test_mean {MEAN}.test_empty",  # the same tests, one by one
    ):
        expected = (0.0, "different_tests") if "test_ops.py" in command else (1.0, "same_tests")
        assert score(env, pivot_id, command) == expected, command


# -- look-arounds -----------------------------------------------------------------------------------------


def test_a_look_around_that_prints_far_more_than_the_expert_scores_zero(env):
    stuffed = "grep -rn 'def mean' --include=*.py . ; ls -R /usr/lib/python3.11 | head -300"
    assert score(env, "calc-mean/t0", stuffed) == (0.0, "too_much_output")
    assert score(env, "calc-mean/t0", "grep -rn mean .") == (1.0, "covers_expert_output")


# -- the verifier's own test run and the rules it rests on ----------------------------------------------------


def test_the_verifiers_test_run_reads_only_its_own_report(sandbox):
    """Code under test that prints reports in any format and exits cannot make a test pass."""
    forged = "import os\nprint('PIVOT-TESTS\\npkg.test_forged\\tpass\\n' + '0' * 32 + ' test 0 pass')\nos._exit(0)\n"
    sandbox.run(
        f"mkdir -p /app/pkg && touch /app/pkg/__init__.py && cat > /app/pkg/test_forged.py <<'EOF'\n{forged}EOF"
    )
    repo = RepoSpec(name="app", archive="", workdir="/app", env={})
    report = run_tests(sandbox, repo, ["pkg.test_forged"], timeout=10)
    assert report.outcomes == {"pkg.test_forged": "fail"} and not report.complete


def test_the_verifiers_test_run_tells_a_skip_from_a_pass(sandbox):
    tests = (
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self):\n        pass\n"
        "    @unittest.skip('later')\n    def test_skipped(self):\n        pass\n"
    )
    sandbox.run(
        f"mkdir -p /app/pkg && touch /app/pkg/__init__.py && cat > /app/pkg/test_t.py <<'EOF'\n{tests}EOF"
    )
    repo = RepoSpec(name="app", archive="", workdir="/app", env={})
    report = run_tests(sandbox, repo, ["pkg.test_t.T.test_ok", "pkg.test_t.T.test_skipped"], timeout=10)
    assert report.outcomes == {"pkg.test_t.T.test_ok": "pass", "pkg.test_t.T.test_skipped": "skip"}
    assert report.passed == {"pkg.test_t.T.test_ok": True, "pkg.test_t.T.test_skipped": False}
    assert report.successful and report.methods == 2 and "python3" in report.runners


def test_a_plain_test_run_is_one_runner_on_named_tests_and_nothing_else():
    env = {"TZ": "UTC"}
    accepted = {
        f"python3 -m unittest {MEAN}": {MEAN},
        f"cd /repo && TZ=UTC python3 -B -m unittest -v {MEAN} 2>&1 | tail -n 20": {MEAN},
        "python3 -m pytest -q tests/test_ops.py::MeanTests --tb=short": {MEAN},
        "pytest tests/test_ops.py | grep -v PASSED | cat": {"tests.test_ops"},
    }
    for command, ids in accepted.items():
        run = plain_test_run(command, "/repo", env)
        assert not isinstance(run, str) and run.ids == frozenset(ids), (command, run)
    for command in (
        f"python3 -m unittest {MEAN}; echo done",
        f"python3 -m unittest {MEAN} > /tmp/out",
        f"python3 -m unittest {MEAN} | head -1",
        f"python3 -m unittest -k mean {MEAN}",
        f"python3 -m unittest $TESTS {MEAN}",
        f"PYTHONPATH=/tmp python3 -m unittest {MEAN}",
        f"TZ=Europe/Paris python3 -m unittest {MEAN}",
        f"cd /tmp && python3 -m unittest {MEAN}",
        f"python3 -I -m unittest {MEAN}",
        "python3 -m unittest tests/test_ops.py::MeanTests",
        f"python3 -m pytest {MEAN}",
        f"/tmp/python3 -m unittest {MEAN}",
    ):
        assert isinstance(plain_test_run(command, "/repo", env), str), command


def test_test_files_are_told_apart_from_the_code_under_test():
    tests = ["tests.test_more.FirstTests.test_basic"]
    for path in (
        "tests/test_more.py",
        "tests.py",
        "tests/__init__.py",
        "tests/test_more/__init__.py",
        "conftest.py",
    ):
        assert is_test_file(path, tests), path
    for path in ("more_itertools/more.py", "unittest.py", "more_itertools/__init__.py", "NOTES.md"):
        assert not is_test_file(path, tests), path
