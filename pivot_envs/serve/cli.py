"""`pivotrl serve`: host a registered pivot env over HTTP (the library's session protocol and
NeMo-Gym's resource-server protocol); see docs/serve.md."""

from __future__ import annotations

import argparse

from pivot_envs.config import ConfigError, add_config

NAME = "serve"
HELP = "Serve a pivot env over HTTP: sessions with one action or a batch, and NeMo-Gym's /seed_session and /verify."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.serve.config import ServeConfig

    add_config(parser, ServeConfig, "serve")
    parser.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of gym.make (repeatable; a JSON value is parsed: warm_pool=0, sandbox=bwrap)",
    )


def main(args: argparse.Namespace) -> int:
    from pivot_envs.cli._checks import check_env_id
    from pivot_envs.errors import MissingExtraError
    from pivot_envs.serve.config import ServeConfig, parse_env_args

    config: ServeConfig = args.serve
    if not config.env:
        raise ConfigError("--env is required: the env id to serve (e.g. pivot/terminal-v0)")
    check_env_id(config.env)
    config.env_kwargs = {**config.env_kwargs, **parse_env_args(args.env_arg)}
    config.check_exposure()  # before any env is built: an exposed server without a token never starts
    try:
        from pivot_envs.serve.server import serve
    except ImportError as error:
        raise MissingExtraError("pivotrl serve", error.name or "fastapi", "serve") from None
    serve(config, announce=lambda line: print(line, flush=True))
    return 0
