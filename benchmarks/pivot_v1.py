"""NVIDIA's Pivot-v1 rows at full size: extract and filter rows/s and peak memory on a generated file.

Generates N rows (default 100,000) in the four sets' schemas (the sets' proportions: 97k tool use,
50k SWE, 31k terminal, 8.5k function calling), as JSONL and as parquet, then measures, each phase
in its own process (peak memory = that process's max resident set):

- extract: `extract_pivot_v1` (streamed) from JSONL and from parquet -> pivot JSONL;
- baseline: every pivot of the same JSONL held in memory (`list(iter_pivot_v1(...))`), as a reader that
  returns a list does (`read_as_pivots` itself now streams Pivot-v1 files);
- filter: D_adv (Eq. 5) streamed over the extracted pivots, vs `pivotrl filter`'s in-memory path
  (`read_pivots` + `filter_pivots`).

Goal: each streamed phase under 60 s and 1 GB on 2 cores. Prints a table, writes
benchmarks/out/pivot_v1.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "pivot_v1.json"
SHARES = (("conversational-tool-use", 97), ("swe", 50), ("terminal", 31), ("function-calling", 8.5))
TOOLS = [
    {
        "type": "function",
        "name": name,
        "description": f"{name.replace('_', ' ')} for the customer.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
        "strict": True,
    }
    for name in ("get_order", "cancel_order", "transfer_to_human", "lookup_user")
]
TEXT = "The customer asks about their order and the policy on refunds for items bought on sale. " * 3


def _row(kind: str, index: int, rng: random.Random) -> dict:
    turns = rng.randint(1, 4)
    items: list[dict] = [{"role": "system", "content": "You are a helpful agent. " + TEXT}]
    for turn in range(turns):
        items.append({"role": "user", "content": f"Request {turn}: {TEXT}"})
        items.append({"role": "assistant", "content": f"Working on request {turn}."})
    if kind == "terminal":
        answer = json.dumps(
            {"analysis": TEXT, "plan": "list", "commands": [{"keystrokes": "ls -la\n", "duration": 1}]}
        )
        return {
            "responses_create_params": {"input": [i for i in items if i["role"] != "system"]},
            "expected_answer": answer,
            "metadata": {
                "source_trajectory_uid": f"traj-{index // 10}",
                "task_name": "t",
                "harness": "terminus_2",
            },
            "agent_ref": {"type": "responses_api_agents", "name": "terminus_judge_string_only_simple_agent"},
        }
    action = (
        {"type": "message", "content": "Your order has shipped."}
        if rng.random() < 0.3
        else {"type": "function_call", "name": "get_order", "arguments": json.dumps({"id": f"A{index}"})}
    )
    row = {
        "trajectory_id": index // 5,
        "responses_create_params": {"input": items, "tools": TOOLS, "parallel_tool_calls": False},
        "expected_action": action,
    }
    passed = rng.randint(0, 16)
    if kind == "conversational-tool-use":
        row.update(
            meta_info={"turn": turns, "step": turns, "assistant_depth": turns},
            agent_ref={"type": "responses_api_agents", "name": "tool_use_agent"},
            pass_rate=passed / 16,
            pass_rate_total=16,
            pass_rate_passed=passed,
        )
    elif kind == "swe":
        row.update(
            agent_ref={
                "type": "responses_api_agents",
                "name": "single_step_tool_use_with_argument_comparison_swe",
            },
            pass_rate=rng.randint(0, 8) / 8,
            metadata={"harness": "codex"},
        )
    else:
        row.update(
            info={"turn": turns, "step": turns, "depth": turns}, agent_ref={"type": "x", "name": "fc_agent"}
        )
    return row


def generate(rows: int, folder: Path) -> Path:
    """A JSONL file of `rows` rows, the sets mixed in their proportions."""
    rng = random.Random(0)
    total = sum(share for _, share in SHARES)
    kinds = [kind for kind, share in SHARES for _ in range(round(1000 * share / total))]
    jsonl = folder / "pivot_v1.jsonl"
    with open(jsonl, "w") as handle:
        for index in range(rows):
            handle.write(json.dumps(_row(kinds[index % len(kinds)], index, rng)) + "\n")
    return jsonl


def phase(name: str, source: Path, out: Path) -> dict:
    """Run one measured phase in this process; returns rows, seconds and peak RSS."""
    from pivot_envs.extract import filter_pivots
    from pivot_envs.formats.nemotron_pivot_v1 import extract_pivot_v1, iter_pivot_v1
    from pivot_envs.pivot import PivotWriter, iter_pivots, read_pivots

    start = time.perf_counter()
    if name.startswith("extract"):
        rows = extract_pivot_v1([source], out).written
    elif name == "baseline: all pivots in memory":
        rows = len(list(iter_pivot_v1(source)))
    elif name == "filter (streamed)":
        rows, chunk = 0, []
        with PivotWriter(out, append=False, fsync=False) as writer:
            for pivot in iter_pivots(source):
                rows += 1
                chunk.append(pivot)
                if len(chunk) == 1000:
                    for kept in filter_pivots([p for p in chunk if p.profile is not None], 0.6):
                        writer.write(kept)
                    chunk = []
            for kept in filter_pivots([p for p in chunk if p.profile is not None], 0.6):
                writer.write(kept)
    else:  # pivotrl filter's path: every pivot in memory
        pivots = read_pivots(source)
        rows = len(pivots)
        with PivotWriter(out, append=False, fsync=False) as writer:
            for kept in filter_pivots([p for p in pivots if p.profile is not None], 0.6):
                writer.write(kept)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "phase": name,
        "rows": rows,
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "peak_mb": peak / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, Path(args.source), Path(args.out))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        jsonl = generate(args.rows, folder)
        generated = time.perf_counter() - start
        hub_parquet = _hub_parquet(jsonl, folder)
        runs = [
            ("extract JSONL (streamed)", jsonl, folder / "cands.jsonl"),
            ("extract parquet (streamed)", hub_parquet, folder / "cands_pq.jsonl"),
            ("baseline: all pivots in memory", jsonl, folder / "unused.jsonl"),
            ("filter (streamed)", folder / "cands.jsonl", folder / "adv.jsonl"),
            ("baseline: pivotrl filter in memory", folder / "cands.jsonl", folder / "adv_mem.jsonl"),
        ]
        results = []
        for name, source, out in runs:
            done = subprocess.run(
                [sys.executable, __file__, "--phase", name, "--source", str(source), "--out", str(out)],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            if done.returncode:
                results.append({"phase": name, "error": done.stderr.strip().splitlines()[-1]})
                continue
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        sizes = {"jsonl_mb": jsonl.stat().st_size / 2**20, "parquet_mb": hub_parquet.stat().st_size / 2**20}
    print(
        f"{args.rows} rows generated in {generated:.1f} s; JSONL {sizes['jsonl_mb']:.0f} MB, parquet {sizes['parquet_mb']:.0f} MB"
    )
    print(f"{'phase':38} {'rows':>8} {'s':>7} {'rows/s':>9} {'peak MB':>8}")
    for r in results:
        if "error" in r:
            print(f"{r['phase']:38} error: {r['error']}")
        else:
            print(
                f"{r['phase']:38} {r['rows']:>8} {r['seconds']:>7.1f} {r['rows_per_s']:>9.0f} {r['peak_mb']:>8.0f}"
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps({"rows": args.rows, "cpus": os.cpu_count(), **sizes, "results": results}, indent=2)
    )
    print(f"-> {OUT}")


def _hub_parquet(jsonl: Path, folder: Path) -> Path:
    """The rows as typed parquet columns, as the Hub's converter writes a set (one union struct type)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = folder / "pivot_v1.parquet"
    writer, batch = None, []
    schema = None
    with open(jsonl) as handle:
        for line in handle:
            batch.append(json.loads(line))
            if len(batch) == 5000:
                schema, writer = _write_batch(batch, out, schema, writer, pa, pq)
                batch = []
    if batch:
        schema, writer = _write_batch(batch, out, schema, writer, pa, pq)
    writer.close()
    return out


def _write_batch(batch, out, schema, writer, pa, pq):
    # Every set's keys in every row (null where a set lacks them), so all batches share one type.
    keys = (
        "trajectory_id",
        "responses_create_params",
        "expected_action",
        "expected_answer",
        "meta_info",
        "info",
        "metadata",
        "agent_ref",
        "pass_rate",
        "pass_rate_total",
        "pass_rate_passed",
    )
    array = pa.array([{k: row.get(k) for k in keys} for row in batch], type=schema)
    table = pa.Table.from_batches([pa.RecordBatch.from_struct_array(array)])
    if writer is None:
        schema = array.type
        writer = pq.ParquetWriter(out, table.schema)
    writer.write_table(table)
    return schema, writer


if __name__ == "__main__":
    main()
