"""`pivotrl reproduce`: the paper's claims at small scale, with a verdict per claim decided by its 95% interval.

An adapter's command (it trains with adapters.grpo and adapters.sft): the entry point `reproduce`
of the group `pivot_envs.commands` names this module. See docs/reproduce.md.
"""

from __future__ import annotations

import argparse

NAME = "reproduce"
HELP = "Reproduce the paper's claims at small scale (signal, strict vs functional, ablation, SFT, objective, theorems, E2E RL)."


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.cli.options import add_policy_options

    parser.add_argument(
        "--scale",
        default="quick",
        help="quick (toy sizes, minutes), cpu (SmolLM2-135M, about 2 h on "
        "2 cores) or gpu (more of everything, one GPU)",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="output folder (default: runs/reproduce-SCALE); a rerun into it skips the finished stages",
    )
    parser.add_argument(
        "--seeds",
        default=None,
        metavar="N|LIST",
        help="training seeds: a count N (seeds 0..N-1; default: the scale's, 3+) or seeds and ranges (100-114, "
        "3,5,8-9): new seeds run without retraining finished ones, and processes can train disjoint seeds",
    )
    parser.add_argument(
        "--only",
        type=_names,
        default=None,
        metavar="CLAIM,...",
        help="experiments to run: signal, strict-functional, ablation, sft, objective, online, theorems, e2e "
        "(default: all of these), or a pre-registered one alone: sft-matched (E1 of docs/preregistration.md), "
        "paper-regime-pilot then paper-regime (E2), reward-confirmation (E3)",
    )
    parser.add_argument(
        "--domains",
        type=_names,
        default=None,
        metavar="DOMAIN,...",
        help="bundled domains to measure (default: the scale's)",
    )
    parser.add_argument(
        "--compared-pivots",
        type=int,
        default=None,
        metavar="N",
        help="held-out pivots of each training domain the arms are compared on (0: all of them; default: the "
        "scale's evaluation sample). About 400 decide a 10-point difference unpaired; see docs/reproduce.md",
    )
    parser.add_argument(
        "--finished-only",
        action="store_true",
        help="train no arm: report from the seeds each arm finished in an earlier run into --out (seeds 0, 1, "
        "... up to the first missing one); each comparison pairs the seeds both its arms have",
    )
    add_policy_options(parser, "policy", "device", default="the scale's")  # the policy to start from
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="sets",
        metavar="FIELD=VALUE",
        help="change one of the scale's sizes (repeatable): --set steps=20 --set ks=4,8; the fields are listed "
        "in docs/reproduce.md, and the report's notes name what was set",
    )


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pivot_envs.adapters.reproduce.runner import check_only, parse_seeds, reproduce
    from pivot_envs.adapters.reproduce.scales import get_scale
    from pivot_envs.cli._checks import check_domain, check_output

    only = check_only(args.only)
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    domains = tuple(check_domain(name) for name in args.domains) if args.domains else None
    scale = get_scale(
        args.scale,
        seeds=seeds if isinstance(seeds, int) else None,
        domains=domains,
        policy=args.policy,
        device=args.device,
        compared_pivots=args.compared_pivots,
        sets=args.sets,
    )
    for name in {*scale.domains, *scale.train_domains, *scale.profile_domains}:
        check_domain(name)  # names given through --set
    out = check_output(args.out or f"runs/reproduce-{scale.name}", "--out", directory=True)
    path, stages = reproduce(
        scale,
        Path(out),
        only,
        finished_only=args.finished_only,
        seeds=seeds if isinstance(seeds, list) else None,
    )
    print(f"\n{len(stages.computed)} stages run, {len(stages.reused)} read from an earlier run")
    print(f"report: {path}" if path else "no report yet: registered seeds are missing (above)")
    return 0
