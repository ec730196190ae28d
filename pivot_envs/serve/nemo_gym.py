"""NeMo-Gym's resource-server protocol on the serve app: `/seed_session` and `/verify`.

NeMo-Gym's agents call a resources server with the dataset row: `POST /seed_session` with the
row (answered `{}`), then `POST /verify` with the row plus `response`, the model's Responses API
output (`BaseVerifyRequest`: `responses_create_params`, `response`, and a pivot server's own
fields such as `expected_action` and `uuid`). The answer is the request with `reward` added
(`BaseVerifyResponse`), as NeMo-Gym's pivot servers (single_step_tool_use_with_argument_comparison,
swe_pivot, terminal_multi_harness) answer, plus `verdict`: our category, valid, strict reward,
detail and the pivot id. With observability on, NeMo-Gym prefixes the paths with
`/ng-rollout/{rollout_id}`; those paths are served too.

The reward comes from the served env's executing verifier at the pivot the request names: the
row's `uuid` (or `id`) when it is one of the server's pivots, else the server's pivot whose row
has the same `responses_create_params.input` and `expected_action` (NeMo-Gym's own rows carry no
id: a server started with `--pivots rows.jsonl` finds each row's pivot so), else a pivot built from the row
itself (`responses_create_params.input` as the prefix, `expected_action` as the expert: see
pivot_envs.formats.nemo_gym_pivots) in an env of its own for this request. An infrastructure
failure is reward 0.0 with `verdict.valid` false (NeMo-Gym has no invalid sample).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from pivot_envs.formats.nemo_gym_pivots import nemo_gym_row_to_pivot, pivot_to_nemo_gym_row
from pivot_envs.formats.records import MalformedRecord
from pivot_envs.formats.responses import responses_to_messages
from pivot_envs.pivot import Pivot
from pivot_envs.serve.state import HTTPError, ServerState, json_response

ROLLOUT_PREFIX = "/ng-rollout/{rollout_id}"  # NeMo-Gym's path prefix under observability


def response_action(response: Any) -> dict:
    """A NeMo-Gym `response` (Responses API object with `output` items) as one assistant message:
    its text and all its function calls (call ids kept). Raises HTTPError 422 naming the field."""
    if not isinstance(response, dict):
        raise HTTPError(422, f"response: must be a Responses API object, got {type(response).__name__}")
    output = response.get("output")
    if not isinstance(output, list):
        raise HTTPError(422, f"response.output: must be a list of output items, got {type(output).__name__}")
    try:
        messages = responses_to_messages(output)
    except MalformedRecord as error:
        raise HTTPError(422, f"response.output: {error}") from None
    turns = [message for message in messages if message["role"] == "assistant"]
    if len(turns) == 1:
        return turns[0]
    # Several turns (reasoning, text and calls split) or none: one message with the first text and every call.
    action: dict[str, Any] = {
        "role": "assistant",
        "content": next((turn["content"] for turn in turns if turn.get("content")), None)
        or ("" if not turns else None),
    }
    calls = [call for turn in turns for call in turn.get("tool_calls") or ()]
    if calls:
        action["tool_calls"] = calls
    return action


def request_pivot(row: dict, domain: str) -> Pivot:
    """The pivot a verify request carries whole (its prefix and `expected_action`); raises
    HTTPError 422 naming the field that keeps it from being one."""
    fields = {key: value for key, value in row.items() if key != "response"}
    if "expected_action" not in fields:
        raise HTTPError(
            422,
            "expected_action: the request names no pivot of this server (uuid/id) and carries no "
            "expected_action to build one from",
        )
    try:
        return nemo_gym_row_to_pivot(fields, default_id="request", domain=domain)
    except MalformedRecord as error:
        raise HTTPError(422, f"the request is not a NeMo-Gym pivot row: {error}") from None


def row_key(row: dict) -> str | None:
    """A digest of a row's prefix items and expected action (None when it has neither)."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict) or "expected_action" not in row:
        return None
    text = json.dumps([params.get("input"), row["expected_action"]], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


async def pivot_of_row(state: ServerState, row: dict) -> str | None:
    """The id of the server's pivot the row names by `uuid`/`id` or matches by content, else None."""
    named = row.get("uuid") if row.get("uuid") is not None else row.get("id")
    if named is not None and str(named) in state.pivot_index:
        return str(named)
    key = row_key(row)
    if key is None:
        return None
    if state.row_index is None:  # built once, off the event loop, by the first request that needs it
        state.row_index = await state.pool.run(_row_index, state.pivots)
    return state.row_index.get(key)


def _row_index(pivots: list[Pivot]) -> dict[str | None, str]:
    """Row digest -> pivot id, for the rows the pivots are written as."""
    return {row_key(pivot_to_nemo_gym_row(pivot)): pivot.id for pivot in pivots}


def _score(env: Any, options: dict, action: dict) -> tuple[dict, float]:
    """Reset `env` with `options`, step `action`: (the verdict fields, seconds)."""
    started = time.perf_counter()
    env.reset(options=options)
    _, reward, _, _, info = env.step(action)
    verdict = {
        "category": str(info.get("category", "")),
        "valid": bool(info.get("valid", True)),
        "strict_reward": float(info.get("strict_reward", 0.0)),
        "detail": str(info.get("detail", "")),
        "pivot_id": info.get("pivot_id"),
        "reward": float(reward),
    }
    return verdict, time.perf_counter() - started


async def verify(state: ServerState, row: Any) -> dict:
    """The verify answer to `row`: the row with `reward` and `verdict` added."""
    if not isinstance(row, dict):
        raise HTTPError(422, f"body: a verify request must be a JSON object, got {type(row).__name__}")
    if not isinstance(row.get("responses_create_params"), dict):
        raise HTTPError(422, "responses_create_params: required, a Responses API request object")
    if "response" not in row:
        raise HTTPError(422, "response: required, the model's Responses API output")
    action = response_action(row["response"])
    pool = state.pool
    named = await pivot_of_row(state, row)
    if named is not None:
        env = await pool.lease()
        broken = True
        try:
            verdict, seconds = await pool.run(_score, env, {"pivot": named}, action)
            broken = False
        except Exception as error:
            raise HTTPError(500, f"pivot {named}: the env raised {type(error).__name__}: {error}") from error
        finally:
            await pool.give_back(env, broken)
    else:
        pivot = request_pivot(row, state.domain)
        env = await pool.lease_one_off(state.make_env_for([pivot]))
        try:
            verdict, seconds = await pool.run(_score, env, {"index": 0}, action)
        except Exception as error:
            raise HTTPError(
                422,
                f"the request's own pivot cannot be scored by {state.config.env}: {type(error).__name__}: {error}",
            ) from error
        finally:
            await pool.close_one_off(env)
    state.observe([seconds])
    reward = verdict.pop("reward")
    return {**row, "reward": reward, "verdict": verdict}


def add_routes(app: FastAPI, state: ServerState) -> None:
    """Serve `/seed_session` and `/verify` (and their `/ng-rollout/{rollout_id}` forms) on `app`."""

    async def seed_session(request: Request) -> Response:
        await _json_body(request)  # a malformed body is refused here as NeMo-Gym's servers refuse it
        return json_response({})

    async def verify_route(request: Request) -> Response:
        return json_response(await verify(state, await _json_body(request)))

    for prefix in ("", ROLLOUT_PREFIX):
        app.post(f"{prefix}/seed_session")(seed_session)
        app.post(f"{prefix}/verify")(verify_route)


async def _json_body(request: Request) -> Any:
    body = await request.body()
    if not body:
        return {}
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HTTPError(400, f"body: not JSON ({error})") from None
