"""`pivotrl eval`: turn accuracy at held-out pivots, functional and strict, with 95% Wilson intervals."""

from __future__ import annotations

import argparse

from pivot_envs.config import add_config

NAME = "eval"
HELP = (
    "Evaluate a policy at held-out pivots: turn accuracy per domain (functional and strict verifier, 95% CI)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.cli.options import add_policy_options
    from pivot_envs.evaluate import EvalConfig

    parser.add_argument(
        "--pivots",
        required=True,
        help="held-out pivots (JSONL, .jsonl.gz, or any readable trajectory format)",
    )
    add_policy_options(parser, "policy", required=True)
    parser.add_argument(
        "--env", default=None, help="env id scoring every pivot (default: pivot/<domain>-v0 per domain)"
    )
    add_policy_options(parser, "device", "dtype", "max_prompt_tokens")
    parser.add_argument("--json", default=None, help="also write the report as JSON to this path")
    add_config(parser, EvalConfig, "eval")


def main(args: argparse.Namespace) -> int:
    import json

    from pivot_envs.cli._checks import (
        check_output,
        check_scoring,
        file_errors,
        load_named_policy,
        policy_options,
        read_input,
    )
    from pivot_envs.evaluate import EvalConfig, evaluate

    config: EvalConfig = args.eval
    # Every input is checked before the policy loads.
    pivots = read_input(args.pivots)
    check_scoring(pivots, args.env, config.verifier)
    json_out = check_output(args.json, "--json") if args.json else None
    policy = load_named_policy(args.policy, **policy_options(args.device, args.max_prompt_tokens, args.dtype))
    report = evaluate(policy, pivots, config, env=args.env)
    print(report.format())
    if json_out:
        with file_errors(json_out, "--json"):
            json_out.write_text(json.dumps(report.to_dict(), indent=2))
    return 0
