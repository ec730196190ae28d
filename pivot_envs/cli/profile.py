"""`pivotrl profile`: sample K actions per candidate from a reference policy and score them (paper Eq. 4)."""

from __future__ import annotations

import argparse
import logging

from pivot_envs.config import add_config

log = logging.getLogger(__name__)

NAME = "profile"
HELP = "Profile pivot candidates: K sampled actions each, functional and strict rewards, resumable output."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.cli.options import add_policy_options
    from pivot_envs.profile import ProfileConfig

    parser.add_argument("pivots", metavar="PIVOTS", help="candidate pivots (JSONL, .jsonl.gz)")
    add_policy_options(parser, "policy", required=True)  # the reference policy
    parser.add_argument("--out", required=True, help="profiled output (JSONL); rerunning resumes it")
    add_policy_options(parser, "device", "dtype")
    add_config(parser, ProfileConfig, "profile")


def main(args: argparse.Namespace) -> int:
    from pivot_envs.cli._checks import check_output, check_scoring, policy_options, read_input
    from pivot_envs.config import progress_disabled
    from pivot_envs.pivot import read_pivots
    from pivot_envs.profile import ProfileConfig, profile

    config: ProfileConfig = args.profile
    if progress_disabled():  # -q
        config.progress = False
    # Every input is checked before the policy loads: a wrong name fails in a second, not after sampling.
    candidates = read_input(args.pivots)
    check_scoring(candidates, config.env, config.env_kwargs.get("verifier"))
    check_output(args.out)
    options = policy_options(args.device, dtype=args.dtype)
    run = profile(candidates, args.policy, args.out, config, policy_options=options)
    if run.moved_aside:
        log.warning("%s held profiles made with other settings: moved to %s", args.out, run.moved_aside)
    log.info(
        "profiled %d candidates (%d already done) in %.1fs: %d samples (%.2f/s), %d invalid, %d env errors",
        run.profiled,
        run.skipped,
        run.seconds,
        run.samples,
        run.samples_per_s,
        run.invalid,
        run.env_errors,
    )
    print(_report(read_pivots(args.out)))
    return 0


def _report(pivots: list) -> str:
    """The paper's profile diagnostics (zero-variance fraction, mean histogram, miss rate)."""
    from pivot_envs.diagnostics import diagnose, format_report

    return format_report(diagnose(pivots))
