"""Shared test set-up.

Under CI=true a skipped test is a failure, unless it is marked `skip_ok_in_ci` (parts CI can never
have: a GPU). CI installs every other part (Docker, bubblewrap, the model, vLLM on CPU).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "skip_ok_in_ci(reason): a skip CI accepts (no GPU)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and item.get_closest_marker("skip_ok_in_ci") is None:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every part must be installed: {report.longrepr}"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
