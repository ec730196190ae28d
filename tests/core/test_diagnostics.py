"""Diagnostics: hand-computed profile statistics and descriptive counts."""

from __future__ import annotations

import re

import pytest

from pivot_envs.diagnostics import diagnose, format_report
from pivot_envs.pivot import Pivot, Profile


def _pivot(
    pid: str, expert: dict, domain: str = "tool-use", profile: Profile | None = None, prefix: int = 1
) -> Pivot:
    messages = [{"role": "user", "content": "abcd"}] * prefix
    return Pivot(pid, domain, messages, expert, profile=profile)


CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}}],
}
PARALLEL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get", "arguments": "{}"}},
        {"id": "d", "type": "function", "function": {"name": "put", "arguments": "{}"}},
    ],
}
MESSAGE = {"role": "assistant", "content": "hello"}


@pytest.fixture
def profiled() -> list[Pivot]:
    return [
        # mixed, mean 0.5; sample 1 is functionally right but not an exact match (a miss)
        _pivot(
            "a/t0",
            CALL,
            profile=Profile.from_samples(
                [1, 1, 0, 0],
                strict_rewards=[1, 0, 0, 0],
                categories=["exact", "equivalent", "wrong_args", "wrong_tool"],
            ),
        ),
        # uniformly solved, all exact
        _pivot(
            "a/t1",
            MESSAGE,
            profile=Profile.from_samples([1, 1], strict_rewards=[1, 1], categories=["exact", "exact"]),
            prefix=3,
        ),
        # uniformly failed; one sample invalid (masked out)
        _pivot(
            "b/t0",
            PARALLEL,
            domain="terminal",
            profile=Profile.from_samples(
                [0, 0, 0],
                strict_rewards=[0, 0, 0],
                valid=[True, True, False],
                categories=["wrong_tool", "wrong_tool", "infrastructure_error"],
            ),
        ),
        # mixed, mean 2/3 (above lambda_diff 0.6); both successes are misses
        _pivot(
            "b/t1",
            CALL,
            domain="terminal",
            profile=Profile.from_samples(
                [1, 1, 0], strict_rewards=[0, 0, 0], categories=["equivalent", "equivalent", "wrong_args"]
            ),
        ),
        # never profiled
        _pivot("c/t0", CALL),
    ]


def test_profile_statistics_match_hand_computed_values(profiled: list[Pivot]) -> None:
    d = diagnose(profiled, lambda_diff=0.6, bins=4)
    assert d.profiled == 4 and d.scored == 4
    assert d.zero_variance_fraction == 0.5  # a/t1 (all solved) and b/t0 (all failed) of 4
    assert d.all_solved_fraction == 0.25 and d.all_failed_fraction == 0.25
    assert d.adv_count == 1  # only a/t0: b/t1's mean 0.67 is not < 0.6
    # means 0.5, 1.0, 0.0, 0.667 in bins [0,.25) [.25,.5) [.5,.75) [.75,1]
    assert d.mean_histogram == [1, 0, 2, 1] and d.mean_bins == [0, 0.25, 0.5, 0.75, 1.0]
    # functional successes: a/t0 x2, a/t1 x2, b/t1 x2 = 6; strict misses: a/t0 x1, b/t1 x2 = 3
    assert (d.functional_successes, d.strict_misses, d.miss_rate) == (6, 3, 0.5)
    assert d.samples == 12 and d.invalid_samples == 1
    assert d.per_category == {
        "wrong_tool": 3,
        "equivalent": 3,
        "exact": 3,
        "wrong_args": 2,
        "infrastructure_error": 1,
    }


def test_descriptive_counts_and_lengths(profiled: list[Pivot]) -> None:
    d = diagnose(profiled)
    assert d.pivots == 5
    assert d.per_domain == {"tool-use": 3, "terminal": 2}
    assert d.per_action_kind == {"tool_call": 3, "message": 1, "parallel_calls": 1}
    assert d.per_tool == {"get": 4, "put": 1}
    assert (d.prefix_messages.min, d.prefix_messages.max, d.prefix_messages.median) == (1, 3, 1)
    assert d.prefix_chars.max == 12 and d.prefix_chars.min == 4
    # "get" + '{"a":1}' = 3 + 7; "hello" = 5; "get"+"{}"+"put"+"{}" = 10
    assert sorted(d.action_lengths) == [5, 10, 10, 10, 10]


def test_unprofiled_pivots_have_no_profile_statistics() -> None:
    d = diagnose([_pivot("x/t0", CALL)])
    assert (
        d.profiled == 0
        and d.zero_variance_fraction is None
        and d.miss_rate is None
        and d.mean_histogram == []
    )
    assert "zero-variance" not in format_report(d)


def test_report_table_shows_the_paper_statistics(profiled: list[Pivot]) -> None:
    text = format_report(diagnose(profiled, bins=4))
    assert "zero-variance candidates" in text and "50.0%" in text
    assert "miss rate P[strict=0|func=1]" in text and "(3/6)" in text
    assert re.search(r"^D_adv at lambda_diff=0.6 +1 of 4$", text, re.MULTILINE)
    assert "mean in [0.75, 1.00]" in text and "mean in [0.00, 0.25)" in text


def test_diagnose_and_filter_count_d_adv_at_the_filter_configs_lambda_diff() -> None:
    from pivot_envs.extract import FilterConfig, filter_pivots

    # Mixed candidates with means on both sides of any lambda_diff in (0.25, 0.75]: the number is written once.
    pivots = [
        _pivot(f"m/t{i}", MESSAGE, profile=Profile.from_samples(rewards))
        for i, rewards in enumerate(([1, 0, 0, 0], [1, 1, 1, 0]))
    ]
    default = FilterConfig().lambda_diff
    expected = [p.id for p in pivots if p.profile.mean < default]
    assert [p.id for p in filter_pivots(pivots)] == expected and len(expected) == 1
    diagnostics = diagnose(pivots)
    assert diagnostics.lambda_diff == default and diagnostics.adv_count == len(expected)
