"""`pivotrl profile`: sample K actions per candidate from a reference policy and score them (paper Eq. 3)."""

from __future__ import annotations

import argparse
import sys

from pivot_envs.config import add_options, from_args

NAME = "profile"
HELP = "Profile pivot candidates: K sampled actions each, functional and strict rewards, resumable output."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.policy import SPEC_FORMS
    from pivot_envs.profile import ProfileConfig

    parser.add_argument("pivots", metavar="PIVOTS", help="candidate pivots (JSONL, .jsonl.gz)")
    parser.add_argument("--policy", required=True, help=f"reference policy spec: {SPEC_FORMS}")
    parser.add_argument("--out", required=True, help="profiled output (JSONL); rerunning resumes it")
    parser.add_argument("--device", default=None, help="device of a local policy (hf, vllm): cpu, cuda")
    add_options(parser, ProfileConfig)


def main(args: argparse.Namespace) -> int:
    from pivot_envs.pivot import read_pivots
    from pivot_envs.profile import ProfileConfig, profile

    config = from_args(ProfileConfig, args)
    options = {"device": args.device} if args.device else {}
    run = profile(args.pivots, args.policy, args.out, config, policy_options=options)
    if run.moved_aside:
        print(f"{args.out} held profiles made with other settings: moved to {run.moved_aside}", file=sys.stderr)
    print(
        f"profiled {run.profiled} candidates ({run.skipped} already done) in {run.seconds:.1f}s: "
        f"{run.samples} samples ({run.samples_per_s:.2f}/s), {run.invalid} invalid, {run.env_errors} env errors",
        file=sys.stderr,
    )
    print(_report(read_pivots(args.out)))
    return 0


def _report(pivots: list) -> str:
    """The paper's profile diagnostics (zero-variance fraction, mean histogram, miss rate)."""
    from pivot_envs.diagnostics import diagnose, format_report

    return format_report(diagnose(pivots))
