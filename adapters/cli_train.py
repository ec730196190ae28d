"""`pivotrl train`: GRPO at pivots with the bundled trainer (paper Algorithm 1, lines 5-14).

An adapter's command: the entry point `train` of the group `pivot_envs.commands` names this module.
"""

from __future__ import annotations

import argparse

from pivot_envs.config import add_config

NAME = "train"
HELP = (
    "Train a policy with GRPO at pivots: G sampled actions per pivot, verifier rewards, shared-prefix update."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.adapters.grpo import GRPOConfig
    from pivot_envs.cli.options import add_policy_options

    parser.add_argument(
        "--pivots",
        required=True,
        help="training pivots (JSONL, .jsonl.gz, or any readable trajectory format)",
    )
    parser.add_argument(
        "--heldout",
        default=None,
        help="held-out pivots for the turn accuracy logged every --eval-every steps",
    )
    parser.add_argument(
        "--env", default=None, help="env id scoring the actions (default: pivot/<domain>-v0 of the pivots)"
    )
    parser.add_argument(
        "--verifier",
        default=None,
        help="verifier the training rewards come from, by name (default: the domain's functional "
        "one); the --heldout evaluation always uses the domain's",
    )
    parser.add_argument(
        "--env-kwargs",
        default="{}",
        help="keyword arguments of gym.make for --env, as a JSON object "
        '(pivot/remote-v0: \'{"urls": ["http://HOST:PORT"]}\')',
    )
    add_policy_options(parser, "device", "dtype", "max_prompt_tokens")  # --policy is GRPOConfig's
    parser.add_argument(
        "--plot", action="store_true", help="also write OUT/rewards.png (reward mean and std per step)"
    )
    add_config(parser, GRPOConfig, "train")


def main(args: argparse.Namespace) -> int:
    from pivot_envs.adapters.grpo import GRPOConfig, plot_metrics, train
    from pivot_envs.cli._checks import (
        check_output,
        check_plotting,
        check_scoring,
        load_named_policy,
        policy_options,
        read_input,
    )
    from pivot_envs.config import ConfigError, json_object

    config: GRPOConfig = args.train
    env_kwargs = json_object(args.env_kwargs, "--env-kwargs")
    if "env_id" in env_kwargs:  # train() takes the env id itself: --env names it
        raise ConfigError("--env-kwargs: 'env_id' is train()'s own argument; name the env with --env")
    if args.verifier:
        env_kwargs["verifier"] = args.verifier
    # Every input is checked before the policy loads: a wrong name fails in a second, not after loading a model.
    pivots = read_input(args.pivots)
    heldout = read_input(args.heldout) if args.heldout else None
    check_scoring(pivots + (heldout or []), args.env, args.verifier)
    check_output(config.out, "--out", directory=True)
    if args.plot:
        check_plotting("train --plot")
    policy = load_named_policy(
        config.policy, **policy_options(args.device, args.max_prompt_tokens, args.dtype)
    )
    result = train(config, pivots, policy=policy, env_id=args.env, heldout=heldout, **env_kwargs)
    last = result.history[-1] if result.history else {}
    print(f"trained {result.steps} steps; final weights in {result.final}; metrics in {result.metrics_path}")
    if last:
        print(
            f"last step: reward mean {last['reward_mean']:.3f}, zero-variance groups {last['frac_zero_variance']:.2f}"
        )
    if args.plot:
        print(f"plot: {plot_metrics(result.metrics_path, result.out / 'rewards.png')}")
    return 0
