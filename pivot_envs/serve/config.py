"""ServeConfig: every setting of `pivotrl serve` (and of `create_app`), one dataclass."""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from typing import Any

from pivot_envs.config import ConfigError, at_least, json_object, option

TOKEN_VARIABLE = "PIVOT_ENVS_SERVE_TOKEN"


@dataclass
class ServeConfig:
    """Options of `pivotrl serve`."""

    env: str | None = option(None, "gymnasium env id to serve, e.g. pivot/terminal-v0 (required)")
    host: str = option("127.0.0.1", "address to listen on; anything but loopback needs a token")
    port: int = option(8000, "port to listen on; 0 picks a free one (the URL is printed)")
    token: str | None = option(
        None, f"bearer token every request but /health must carry (default: ${TOKEN_VARIABLE})"
    )
    max_sessions: int = option(8, "envs alive at once (sessions plus /verify calls; each holds a sandbox)")
    queue_timeout: float = option(
        30.0, "seconds a request waits for a free env before a 503 with Retry-After"
    )
    session_ttl: float = option(600.0, "seconds a session may stay unused before it is closed")
    max_batch: int = option(64, "actions in one /steps request at most (a larger batch is a 413)")
    body_timeout: float = option(
        60.0, "seconds a client may take to send a request's body once its headers arrived (then a 408)"
    )
    pivots: str | None = option(None, "pivot file the env holds (default: the domain's bundled pivots)")
    env_kwargs: dict[str, Any] | str = option(
        factory=dict, help="keyword arguments of gym.make, as a JSON object"
    )
    openenv: bool = option(
        False, "also speak OpenEnv's protocol (/ws, /reset, /step, /state, /schema); needs the openenv extra"
    )

    def __post_init__(self) -> None:
        self.env_kwargs = json_object(self.env_kwargs, "ServeConfig.env_kwargs")
        at_least(self, 1, "max_sessions", "max_batch")
        at_least(self, 0, "port", "queue_timeout")
        at_least(self, 0.001, "session_ttl", "body_timeout")
        if self.port > 65535:
            raise ConfigError(f"ServeConfig.port = {self.port}: must be in [0, 65535]")

    def effective_token(self) -> str | None:
        """The token given, else the one in $PIVOT_ENVS_SERVE_TOKEN, else None (no auth)."""
        return self.token or os.environ.get(TOKEN_VARIABLE) or None

    def check_exposure(self) -> None:
        """Raise ConfigError when the server would listen beyond loopback without a token."""
        if not is_loopback(self.host) and not self.effective_token():
            raise ConfigError(
                f"ServeConfig.host = {self.host!r} is not a loopback address: anyone who reaches it could run "
                f"actions in the env's sandboxes; pass --token T (or set ${TOKEN_VARIABLE})"
            )


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_env_args(pairs: list[str] | None) -> dict[str, Any]:
    """`key=value` strings as gym.make keyword arguments; a value that reads as JSON (0, true,
    {"timeout": 5}) is that value, any other is the text. Raises ConfigError naming a bad pair."""
    kwargs: dict[str, Any] = {}
    for pair in pairs or ():
        key, eq, text = pair.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--env-arg {pair!r}: must be KEY=VALUE (e.g. sandbox=bwrap)")
        try:
            kwargs[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            kwargs[key.strip()] = text
    return kwargs
