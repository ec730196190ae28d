"""Data-parallel scaling of the bundled GRPO trainer: training samples/s with 1, 2, ... torchrun processes.

Each run is the real loop (`pivot_envs.adapters.grpo.train`) launched by torchrun (torch.distributed.run,
gloo on a CPU, nccl with one GPU per process): per step B pivots of the bundled tool-use domain, G
actions sampled at each, scored by the tool-use env, the update of Eq. 7; with N processes each
takes B/N pivots and the gradients are summed across them (grpo.distributed). A step's samples are
B x G whatever N; samples/s is B x G over the mean step time of rank 0 (which waits for the others
at the all-reduce), the first step left out (warm-up). The reward is a toy verifier (the action
contains the letter 'a') so that groups are mixed and every step updates. Efficiency at N is
samples/s(N) / (N x samples/s(1)). The machine's cores are divided among the processes
(`--threads` per process: cores / N by default), so on a small CPU more processes gain little.

    python benchmarks/grpo_scaling.py                              # 1 and 2 processes, a 6-layer SmolLM2-135M shape
    python benchmarks/grpo_scaling.py --nproc 1 2 4 --layers 0     # the full 30 layers
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from grpo_throughput import load_model  # noqa: E402
from toys import HasLetterVerifier  # noqa: E402  (the tests' toy verifier)


def worker(args: argparse.Namespace) -> None:
    """One rank of a run: the training loop on the bundled tool-use pivots, metrics in args.out (rank 0)."""
    import gymnasium as gym
    import torch
    from transformers import AutoTokenizer

    import pivot_envs
    from pivot_envs.adapters import smollm2
    from pivot_envs.adapters.grpo import GRPOConfig, train
    from pivot_envs.adapters.policies.hf import HFPolicy

    torch.set_num_threads(args.threads)
    gym.register_envs(pivot_envs)
    pivots = gym.make("pivot/tool-use-v0").unwrapped.pivots
    tokenizer = AutoTokenizer.from_pretrained(smollm2.checkpoint())
    model = load_model(True, "135m", "cpu", torch.float32, args.layers)
    config = GRPOConfig(
        batch_pivots=args.batch_pivots,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        steps=args.steps,
        checkpoint_every=0,
        eval_every=0,
        num_envs=2,
        out=args.out,
        seed=0,
    )
    train(
        config,
        pivots,
        policy=HFPolicy(model, tokenizer, name="hf:random"),
        env_id="pivot/tool-use-v0",
        verifier=HasLetterVerifier(),
    )


def launch(nproc: int, threads: int, args: argparse.Namespace, out: Path) -> dict:
    """One torchrun run of `nproc` processes; returns its figures."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(Path(__file__).resolve()),
        "--worker",
        "--out",
        str(out),
        "--threads",
        str(threads),
        "--layers",
        str(args.layers),
        "--batch-pivots",
        str(args.batch_pivots),
        "--group-size",
        str(args.group_size),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--steps",
        str(args.steps),
    ]
    subprocess.run(command, check=True, cwd=HERE, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    seconds = statistics.mean(r["time_generate_s"] + r["time_score_s"] + r["time_update_s"] for r in records)
    return {
        "processes": nproc,
        "threads_per_process": threads,
        "step_s": seconds,
        "samples_per_s": args.batch_pivots * args.group_size / seconds,
        "generate_s": statistics.mean(r["time_generate_s"] for r in records),
        "update_s": statistics.mean(r["time_update_s"] for r in records),
        "groups_trained": statistics.mean(r["groups_trained"] for r in records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="processes per run (torchrun)")
    parser.add_argument(
        "--layers", type=int, default=6, help="layers of the random-init SmolLM2-135M shape (0: all 30)"
    )
    parser.add_argument(
        "--batch-pivots", type=int, default=4, help="B: pivots per step, split across the processes"
    )
    parser.add_argument("--group-size", type=int, default=4, help="G: actions per pivot")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="longest action sampled")
    parser.add_argument(
        "--steps", type=int, default=4, help="steps per run (the first is warm-up, not counted)"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads per process (0: the cores / processes)"
    )
    parser.add_argument("--out", default=str(HERE / "out" / "grpo_scaling.json"), help="JSON results")
    parser.add_argument(
        "--worker", action="store_true", help=argparse.SUPPRESS
    )  # one rank, started by torchrun
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for nproc in args.nproc:
            threads = args.threads or max(1, cores // nproc)
            rows.append(launch(nproc, threads, args, Path(scratch) / f"n{nproc}"))
    base = rows[0]["samples_per_s"] / rows[0]["processes"]
    print(
        f"\nSmolLM2-135M shape, {args.layers or 30} layers (random init), B {args.batch_pivots}, G {args.group_size}, "
        f"max {args.max_new_tokens} new tokens, {cores} CPU cores, gloo"
    )
    print(
        f"{'procs':>5} {'threads':>7} {'step s':>7} {'gen s':>6} {'update s':>8} {'samples/s':>9} {'efficiency':>10}"
    )
    for row in rows:
        row["efficiency"] = row["samples_per_s"] / (row["processes"] * base)
        print(
            f"{row['processes']:>5} {row['threads_per_process']:>7} {row['step_s']:>7.2f} {row['generate_s']:>6.2f} "
            f"{row['update_s']:>8.2f} {row['samples_per_s']:>9.2f} {row['efficiency']:>10.2f}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "cores": cores,
                "layers": args.layers or 30,
                "rows": rows,
                **{k: getattr(args, k) for k in ("batch_pivots", "group_size", "max_new_tokens", "steps")},
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
