"""GRPO update throughput at pivots: our shared-prefix update, groups packed or one per pass, against trl.GRPOTrainer.

All three update the same model on the same pivot-shaped batches (B pivots, G actions each, a long
prefix of 3P/4..P tokens and short actions of A/2..A tokens), token-level loss, AdamW step:
- packed: `pivot_envs.adapters.grpo.update` with `tokens_per_pass` 8192 (`--tokens-per-pass`; its
  default on a GPU): several groups per pass, their prefixes in one forward, all their actions in a
  second, one backward;
- per-group: the same update with `tokens_per_pass=0` (its default on a CPU; one group per pass: the
  prefix once, its KV cache shared with gradients by the G actions);
- TRL: `GRPOTrainer.compute_loss` over full prompt + completion sequences, `--trl-groups-per-pass`
  groups (G sequences each) per forward/backward.
Prints a table, writes benchmarks/out/grpo_throughput.json, reports the time ratios between them.

    python benchmarks/grpo_throughput.py                          # auto device, SmolLM2-135M, prefix 1024, action 64, B 4, G 8
    python benchmarks/grpo_throughput.py --device cuda --random-init --prefix 1024 2048 4096 --action 64 256
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from peak_memory import best_time_and_peak

# Small enough that the weights barely move: every timed step costs the same.
LEARNING_RATE = 1e-7
# SmolLM2's architectures, for --random-init (no weights needed): 135M (the embedded model) and 1.7B.
COMMON = dict(
    vocab_size=49152,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)
SHAPES = {
    "135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100000.0,
        **COMMON,
    ),
    "1.7b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        rope_theta=130000.0,
        **COMMON,
    ),
}


def load_model(random_init: bool, shape: str, device: str, dtype, layers: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if random_init:
        torch.manual_seed(0)
        config = dict(SHAPES[shape], **({"num_hidden_layers": layers} if layers else {}))
        return LlamaForCausalLM(LlamaConfig(**config)).to(device=device, dtype=dtype).eval()
    if shape != "135m" or layers:
        raise SystemExit("only the 135M model is embedded: use --random-init for --shape 1.7b or --layers")
    from pivot_envs.adapters import smollm2

    return smollm2.load(device=device, dtype=dtype)[0]


def stub_tokenizer():
    """A tiny in-memory tokenizer: TRL's trainer wants one, the update never tokenizes (it gets ids)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "x": 2}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="x")), pad_token="<pad>", eos_token="<eos>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return tokenizer


def make_batch(prefix: int, action: int, groups: int, group_size: int, vocab: int, seed: int):
    """B groups: a random prefix of 3/4 prefix..prefix tokens, G actions of action/2..action tokens, advantages +-1."""
    import random

    rng = random.Random(seed)
    batch = []
    for _ in range(groups):
        ids = [rng.randrange(3, vocab) for _ in range(rng.randint(prefix * 3 // 4, prefix))]
        actions = [
            [rng.randrange(3, vocab) for _ in range(rng.randint(action // 2, action))]
            for _ in range(group_size)
        ]
        advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(group_size)]
        batch.append((ids, actions, advantages))
    return batch


def ours(model, batch, device: str, repeats: int, tokens_per_pass: int):
    import torch

    from pivot_envs.adapters.grpo import Group, GRPOConfig, update

    config = GRPOConfig(learning_rate=LEARNING_RATE, max_grad_norm=0.0, tokens_per_pass=tokens_per_pass)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)

    def step():
        groups = [Group(f"p{i}", ids, actions, adv) for i, (ids, actions, adv) in enumerate(batch)]
        update(model, None, optimizer, groups, config)

    return measure(step, device, repeats)


def trl(model, batch, device: str, repeats: int, action: int, groups_per_pass: int):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    group_size = len(batch[0][1])
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=group_size * groups_per_pass,
            num_generations=group_size,
            max_completion_length=action,
            use_cpu=not device.startswith("cuda"),
            report_to="none",
            beta=0.0,
            loss_type="dapo",
            learning_rate=LEARNING_RATE,
            bf16=next(model.parameters()).dtype == torch.bfloat16,
            gradient_checkpointing=False,  # TRL's default recomputes activations; ours does not, so neither does here
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_list([{"prompt": "x"}]),
            processing_class=stub_tokenizer(),
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    tokens = sum(len(a) for _, actions, _ in batch for a in actions)

    def inputs_of(groups):
        """TRL's batch layout: prompts left-padded, completions right-padded, G rows per group."""
        rows = [(ids, a) for ids, actions, _ in groups for a in actions]
        prompt_width, width = max(len(ids) for ids, _ in rows), max(len(a) for _, a in rows)
        prompt = torch.zeros(len(rows), prompt_width, dtype=torch.long)
        prompt_mask = torch.zeros(len(rows), prompt_width, dtype=torch.long)
        completion = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for row, (ids, a) in enumerate(rows):
            prompt[row, prompt_width - len(ids) :] = torch.tensor(ids)
            prompt_mask[row, prompt_width - len(ids) :] = 1
            completion[row, : len(a)] = torch.tensor(a)
            mask[row, : len(a)] = 1
        return {
            "prompt_ids": prompt.to(device),
            "prompt_mask": prompt_mask.to(device),
            "completion_ids": completion.to(device),
            "completion_mask": mask.to(device),
            "advantages": torch.tensor([x for _, _, adv in groups for x in adv]).to(device),
            "old_per_token_logps": None,
            "num_items_in_batch": torch.tensor(tokens, device=device),
        }

    prepared = [inputs_of(batch[i : i + groups_per_pass]) for i in range(0, len(batch), groups_per_pass)]
    trainer.current_gradient_accumulation_steps = len(prepared)

    def step():
        optimizer.zero_grad(set_to_none=True)
        for inputs in prepared:
            trainer.compute_loss(model, inputs).backward()
        optimizer.step()

    return measure(step, device, repeats)


def measure(step, device: str, repeats: int) -> dict[str, float]:
    step()  # warm-up: allocator, kernels, optimizer state
    seconds, peak = best_time_and_peak(step, device, repeats)
    return {"seconds": seconds, "peak_bytes": peak}


def attempt(method, *args):
    """The method's measurement, or None when it runs out of accelerator memory (reported as OOM)."""
    import torch

    try:
        return method(*args)
    except torch.OutOfMemoryError:
        args[0].zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return None


def cell(value, spec: str, missing: str = "OOM") -> str:
    width = int(spec.split(".")[0])
    return format(value, spec) if value is not None else missing.rjust(width)


def ratio(value, width: int) -> str:
    return (f"{value:.2f}x" if value is not None else "-").rjust(width)


METHODS = ("packed", "per_group", "trl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", default=None, help="cpu, cuda, cuda:1 (default: cuda when available, else cpu)"
    )
    parser.add_argument(
        "--random-init", action="store_true", help="random weights of SmolLM2's shape (no checkpoint)"
    )
    parser.add_argument(
        "--shape", default="135m", choices=sorted(SHAPES), help="SmolLM2 size (1.7b needs --random-init)"
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=0,
        help="with --random-init: this many layers (a shallower model, for quick CPU runs)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="default: float32 on cpu, bfloat16 on cuda",
    )
    parser.add_argument(
        "--prefix",
        type=int,
        nargs="+",
        default=[1024],
        help="longest prefix P (tokens; prefixes are 3P/4..P)",
    )
    parser.add_argument(
        "--action",
        type=int,
        nargs="+",
        default=[64],
        help="longest action (tokens); actions are action/2..action",
    )
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--batch-pivots", type=int, default=4, help="B")
    parser.add_argument(
        "--tokens-per-pass",
        type=int,
        default=8192,
        help="packed: GRPOConfig.tokens_per_pass (its GPU default)",
    )
    parser.add_argument(
        "--trl-groups-per-pass",
        type=int,
        default=1,
        help="groups (G sequences each) per TRL forward/backward",
    )
    parser.add_argument(
        "--methods", nargs="+", default=list(METHODS), choices=METHODS, help="which updates to time"
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed updates per method (best kept), after one warm-up"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "grpo_throughput.json"))
    args = parser.parse_args()

    import torch

    from pivot_envs.adapters.grpo import Group, pack_groups

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokens_per_pass = args.tokens_per_pass
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
    model = load_model(args.random_init, args.shape, device, dtype, args.layers)
    layers = model.config.num_hidden_layers
    header = (
        f"{'prefix':>6} {'action':>6} {'B':>3} {'G':>3} {'passes':>6} {'packed s':>8} {'group s':>8} {'TRL s':>8} "
        f"{'packed tok/s':>12} {'group/packed':>12} {'TRL/packed':>10} {'TRL/group':>9} "
        f"{'packed MiB':>10} {'group MiB':>9} {'TRL MiB':>8}"
    )
    print(
        f"model: SmolLM2-{args.shape} ({'random init' if args.random_init else 'embedded weights'}, {layers} layers), "
        f"{device}, {dtype}, {torch.get_num_threads()} CPU threads, tokens_per_pass {tokens_per_pass}, "
        f"TRL {args.trl_groups_per_pass} group(s) per pass"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for prefix in args.prefix:
        for action in args.action:
            batch = make_batch(
                prefix, action, args.batch_pivots, args.group_size, COMMON["vocab_size"], seed=prefix + action
            )
            tokens = sum(len(a) for _, actions, _ in batch for a in actions)
            passes = len(
                pack_groups([Group("", ids, actions, adv) for ids, actions, adv in batch], tokens_per_pass)
            )
            runs = {
                "packed": (ours, tokens_per_pass),
                "per_group": (ours, 0),
                "trl": (trl, action, args.trl_groups_per_pass),
            }
            results = {
                name: attempt(runs[name][0], model, batch, device, args.repeats, *runs[name][1:])
                if name in args.methods
                else None
                for name in METHODS
            }
            row = {
                "shape": args.shape,
                "layers": layers,
                "prefix": prefix,
                "action": action,
                "batch_pivots": args.batch_pivots,
                "group_size": args.group_size,
                "action_tokens": tokens,
                "tokens_per_pass": tokens_per_pass,
                "packed_passes": passes,
                "trl_groups_per_pass": args.trl_groups_per_pass,
            }
            for name, result in results.items():
                row[f"{name}_s"] = result["seconds"] if result else None
                row[f"{name}_samples_per_s"] = (
                    args.batch_pivots * args.group_size / result["seconds"] if result else None
                )
                row[f"{name}_tokens_per_s"] = tokens / result["seconds"] if result else None
                row[f"{name}_peak_mib"] = result["peak_bytes"] / 2**20 if result else None
            for slower, faster in (("per_group", "packed"), ("trl", "packed"), ("trl", "per_group")):
                a, b = results[slower], results[faster]
                row[f"{slower}_over_{faster}"] = a["seconds"] / b["seconds"] if a and b else None
            rows.append(row)
            gone = {
                name: "OOM" if name in args.methods else "-" for name in METHODS
            }  # out of memory, or not timed
            print(
                f"{prefix:>6} {action:>6} {args.batch_pivots:>3} {args.group_size:>3} {passes:>6} "
                f"{cell(row['packed_s'], '8.2f', gone['packed'])} {cell(row['per_group_s'], '8.2f', gone['per_group'])} "
                f"{cell(row['trl_s'], '8.2f', gone['trl'])} {cell(row['packed_tokens_per_s'], '12.1f', gone['packed'])} "
                f"{ratio(row['per_group_over_packed'], 12)} {ratio(row['trl_over_packed'], 10)} "
                f"{ratio(row['trl_over_per_group'], 9)} {cell(row['packed_peak_mib'], '10.0f', gone['packed'])} "
                f"{cell(row['per_group_peak_mib'], '9.0f', gone['per_group'])} {cell(row['trl_peak_mib'], '8.0f', gone['trl'])}",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "device": device,
                "dtype": str(dtype),
                "random_init": args.random_init,
                "shape": args.shape,
                "layers": layers,
                "threads": torch.get_num_threads(),
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
