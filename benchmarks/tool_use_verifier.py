"""Tool-use verifier benchmark: the strict-vs-functional miss rate and steps per second per core.

    .venv/bin/python benchmarks/tool_use_verifier.py [--repeats 7]

1. Miss rate Pr[strict = 0 | functional = 1] (the paper's diagnostic) over perturbed actions on
   the bundled tau-bench airline pivots: each expert turn is rewritten in equivalent forms (keys
   reordered, integers as floats, a shortened free text, a calculation written differently, a
   different thought, the message reworded or with a closing line added, the same reply from
   another trial of the task: the tuning and held-out replies of data/equivalent_messages.json)
   and wrong forms (wrong value, wrong tool, missing or extra argument, unrelated message, a call
   instead of a message, the next turn's reply, a failed trial's wrong reply at the same step,
   and issue 35's message exploits: the most common words, the previous assistant message, the
   expert's message plus 50 random words). Apart: how often another conversation's expert
   message is accepted (all pairs of message pivots). Ids in another case or padded
   and enums in upper case are equal by the argument rules only: where calls execute, the
   airline database does not find them, so they count as equivalent only with recorded outputs.
2. Steps per second per core of `reset` + `step` through `gym.make` (one process, one thread) over
   the same actions, as raw completion text: verification only (recorded outputs, nothing
   executed) and with the tau-airline backend executing every call; the floor is `json.loads` of
   each action's JSON alone. CPU time (time.process_time) is the best of --repeats runs, so other
   processes on the machine slow the wall clock but not the figure.

Prints a table and writes benchmarks/out/tool_use_verifier.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import gymnasium as gym

import pivot_envs  # noqa: F401  (registers pivot/tool-use-v0)
from pivot_envs.chat import text_of
from pivot_envs.domains.tool_use.content import expert_messages, word_counts
from pivot_envs.domains.tool_use.env import bundled_pivots
from pivot_envs.domains.tool_use.verifier import STOPWORDS, FunctionalVerifier

OUT = Path(__file__).resolve().parent / "out" / "tool_use_verifier.json"
UNRELATED = "I like turtles. Bananas are yellow and grow on tall plants in warm places."
ID_KEYS = ("reservation_id", "user_id", "payment_id")
FREE_TEXT_KEYS = ("summary", "thought")
# Equal by the argument rules, but not in effect where the airline tools execute the call.
BY_ARGUMENTS = "by the argument rules"
TUNING, HELD_OUT = "message from another trial (tuning)", "message from another trial (held out)"
CLOSING = "If you have any other questions or need further assistance, feel free to ask!"
# Kinds added for issue 35; the throughput runs without them, to stay comparable with earlier runs.
ISSUE_35_KINDS = frozenset(
    {
        TUNING,
        HELD_OUT,
        "wrong reply of a failed trial",
        "neighbouring reply (next turn's)",
        "message + a closing line",
        "most common words (R8)",
        "message + 50 random words (R8)",
        "previous assistant message (R8)",
    }
)
EQUIVALENT_MESSAGES = (
    Path(__file__).resolve().parents[1] / "domains" / "tool_use" / "data" / "equivalent_messages.json"
)


def tool_call_text(name: str, arguments: dict, content: str = "") -> str:
    return f"{content}<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def other_case(text: str) -> str:
    return text.lower() if text.upper() == text else text.upper()


class MessageCorpus:
    """What the message perturbations draw on: the common words, the vocabulary, the paired replies
    (equivalent, by split) and wrong replies of data/equivalent_messages.json, the next turn's reply."""

    def __init__(self, pivots) -> None:
        frequency, vocabulary = Counter(), set()
        for text in expert_messages(pivots):
            words = word_counts(text, STOPWORDS)
            frequency.update(words.keys())
            vocabulary.update(words)
        self.common_words = " ".join(word for word, _ in frequency.most_common(40))
        self.vocabulary = sorted(vocabulary)
        by_id = {p.id: p for p in pivots}
        data = json.loads(EQUIVALENT_MESSAGES.read_text())
        self.paired: dict[str, list[tuple[str, str]]] = defaultdict(list)  # pivot id -> (kind, reply)
        for pair in data["pairs"]:
            kind = TUNING if pair["split"] == "tuning" else HELD_OUT
            self.paired[pair["a"]].append((kind, by_id[pair["b"]].expert["content"].strip()))
            self.paired[pair["b"]].append((kind, by_id[pair["a"]].expert["content"].strip()))
        for reply in data["one_way"]:
            kind = TUNING if reply["split"] == "tuning" else HELD_OUT
            self.paired[reply["pivot"]].append((kind, reply["message"]))
        self.wrong: dict[str, list[str]] = defaultdict(list)
        for reply in data["wrong"]:
            self.wrong[reply["pivot"]].append(reply["message"])
        messages = [p for p in pivots if not p.expert.get("tool_calls")]
        self.following = {
            a.id: b.expert["content"].strip()
            for a, b in zip(messages, messages[1:])
            if a.id.rsplit("/", 1)[0] == b.id.rsplit("/", 1)[0]
        }


def previous_assistant_text(pivot) -> str | None:
    for message in reversed(pivot.messages):
        if message.get("role") == "assistant" and (message.get("content") or "").strip():
            return message["content"].strip()
    return None


def message_perturbations(pivot, rng: random.Random, corpus: MessageCorpus) -> list[tuple[str, bool, str]]:
    text = pivot.expert["content"].strip()
    words = text.split()
    reworded = " ".join(w.upper() if i % 7 == 3 else w for i, w in enumerate(words)).replace(" please", "")
    # Its own random stream, so the other perturbations draw what they drew before issue 35.
    words = random.Random(pivot.id)
    padded = text + " " + " ".join(words.choice(corpus.vocabulary) for _ in range(50))
    out = [
        ("expert message", True, text),
        ("message reworded", True, reworded),
        *((kind, True, other) for kind, other in corpus.paired.get(pivot.id, ())),
        ("message + a closing line", True, f"{text} {CLOSING}"),
        *(("wrong reply of a failed trial", False, other) for other in corpus.wrong.get(pivot.id, ())),
        ("unrelated message", False, UNRELATED),
        ("call instead of message", False, tool_call_text("think", {"thought": text[:80]})),
        ("most common words (R8)", False, corpus.common_words),
        ("message + 50 random words (R8)", False, padded),
    ]
    previous = previous_assistant_text(pivot)
    if previous is not None:
        out.append(("previous assistant message (R8)", False, previous))
    if pivot.id in corpus.following:
        out.append(("neighbouring reply (next turn's)", False, corpus.following[pivot.id]))
    return out


def perturbations(pivot, rng: random.Random, corpus: MessageCorpus) -> list[tuple[str, bool | str, str]]:
    """(kind, meant to be equivalent: True, False or BY_ARGUMENTS, completion text) for one pivot."""
    if not pivot.expert.get("tool_calls"):
        return message_perturbations(pivot, rng, corpus)
    function = pivot.expert["tool_calls"][0]["function"]
    name, arguments = function["name"], json.loads(function["arguments"])
    # The expert's text next to its call is kept, so strict differences come from the perturbation.
    content = (pivot.expert.get("content") or "").strip()

    def hermes(name: str, arguments: dict) -> str:
        return tool_call_text(name, arguments, content)

    out = [("expert call", True, hermes(name, arguments))]
    out.append(("keys reordered", True, hermes(name, dict(reversed(list(arguments.items()))))))
    ints = [k for k, v in arguments.items() if type(v) is int]
    if ints:
        out.append(
            (
                "integers as floats",
                True,
                hermes(name, {**arguments, **{k: float(arguments[k]) for k in ints}}),
            )
        )
    for key in ID_KEYS:
        if isinstance(arguments.get(key), str):
            out.append(
                (
                    "id in another case",
                    BY_ARGUMENTS,
                    hermes(name, {**arguments, key: other_case(arguments[key])}),
                )
            )
            out.append(
                (
                    "id padded with spaces",
                    BY_ARGUMENTS,
                    hermes(name, {**arguments, key: f" {arguments[key]} "}),
                )
            )
            out.append(("wrong id", False, hermes(name, {**arguments, key: arguments[key][:-1] + "Q"})))
            break
    if isinstance(arguments.get("cabin"), str):
        out.append(
            (
                "enum in upper case",
                BY_ARGUMENTS,
                hermes(name, {**arguments, "cabin": arguments["cabin"].upper()}),
            )
        )
    if name == "calculate":
        expression = arguments["expression"]
        out.append(
            ("calculation rewritten", True, hermes(name, {"expression": f"({expression.replace(' ', '')})"}))
        )
        out.append(("wrong calculation", False, hermes(name, {"expression": f"{expression} + 1"})))
    if name == "think":
        out.append(
            (
                "different thought",
                True,
                hermes(name, {"thought": "Let me check the policy before answering."}),
            )
        )
    for key in FREE_TEXT_KEYS:
        if name != "think" and isinstance(arguments.get(key), str):
            words = arguments[key].split()
            out.append(
                (
                    "free text shortened",
                    True,
                    hermes(name, {**arguments, key: " ".join(words[: max(1, len(words) * 4 // 5)])}),
                )
            )
    numbers = [k for k, v in arguments.items() if type(v) in (int, float)]
    if numbers:
        key = rng.choice(numbers)
        out.append(("wrong number", False, hermes(name, {**arguments, key: arguments[key] + 1})))
    other = "get_user_details" if name != "get_user_details" else "get_reservation_details"
    out.append(("wrong tool", False, hermes(other, arguments)))
    if arguments:
        dropped = rng.choice(sorted(arguments))
        out.append(
            ("missing argument", False, hermes(name, {k: v for k, v in arguments.items() if k != dropped}))
        )
    out.append(("extra argument", False, hermes(name, {**arguments, "priority": "high"})))
    out.append(("message instead of call", False, "Let me check that for you."))
    return out


def action_json(text: str) -> str:
    """The JSON the floor parses: a tool-call block's body, or the message as a JSON string."""
    start = text.find("<tool_call>")
    if start >= 0:
        return text[start + len("<tool_call>") : -len("</tool_call>")]
    return json.dumps(text)


def miss_rates(actions, backend: str, verifier_config: dict | None = None) -> dict:
    env = gym.make("pivot/tool-use-v0", backend=backend, verifier_config=verifier_config or {})
    executes = backend != "recorded"
    by_kind: dict[str, Counter] = defaultdict(Counter)
    both = Counter()
    for index, kind, meant, text in actions:
        equivalent = meant is True or (meant == BY_ARGUMENTS and not executes)
        env.reset(options={"index": index})
        _, reward, _, _, info = env.step(text)
        functional, strict = reward == 1.0, info["strict_reward"] == 1.0
        counts = by_kind[kind]
        counts["n"] += 1
        counts["functional"] += functional
        counts["strict"] += strict
        counts["missed"] += functional and not strict
        counts["agrees_with_intent"] += functional == equivalent
        both["n"] += 1
        both["functional"] += functional
        both["missed"] += functional and not strict
        both["accepted_wrong"] += functional and not equivalent
        both["rejected_equivalent"] += equivalent and not functional
    return {
        "miss_rate": both["missed"] / max(1, both["functional"]),
        "actions": both["n"],
        "functional_accepts": both["functional"],
        "accepted_but_meant_wrong": both["accepted_wrong"],
        "rejected_but_meant_equivalent": both["rejected_equivalent"],
        "by_kind": {kind: dict(c) for kind, c in sorted(by_kind.items())},
    }


def other_conversations(pivots) -> dict:
    """How often an expert message of another conversation is accepted at a message pivot (all pairs):
    wrong but fluent replies, many of them the same stock question in other words."""
    verifier = FunctionalVerifier()
    messages = [p for p in pivots if not p.expert.get("tool_calls")]
    accepted = total = 0
    for pivot in messages:
        conversation = pivot.id.rsplit("/", 1)[0]
        for other in messages:
            if other.id.rsplit("/", 1)[0] != conversation:
                total += 1
                accepted += (
                    verifier.verify(pivot, {"role": "assistant", "content": text_of(other.expert)}).reward
                    == 1.0
                )
    return {"accepted": accepted, "pairs": total, "share": accepted / total}


def cpu_rate(run, n: int, repeats: int) -> tuple[float, float]:
    """(best steps/s by CPU time, wall steps/s of that run) over `repeats` runs of n steps."""
    best_cpu, best_wall = float("inf"), float("inf")
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        run()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if cpu < best_cpu:
            best_cpu, best_wall = cpu, wall
    return n / best_cpu, n / best_wall


def throughput(actions, repeats: int) -> dict:
    bodies = [action_json(text) for _, _, _, text in actions]
    loads = json.loads

    def floor():
        for body in bodies:
            loads(body)

    results = {"floor_json_loads": cpu_rate(floor, len(bodies), repeats)}
    measures = (
        ("verify_only_recorded", "recorded", True),
        ("with_execution_tau_airline", "tau-airline", True),
        # As the profiler, evaluation and trainer step (EnvPool): no copies of the prefix.
        ("verify_only_recorded_no_copies", "recorded", False),
        ("with_execution_tau_airline_no_copies", "tau-airline", False),
    )
    for label, backend, copies in measures:
        env = gym.make("pivot/tool-use-v0", backend=backend)
        env.unwrapped.copy_observations = copies
        pairs = [(index, text) for index, _, _, text in actions]

        def run(env=env, pairs=pairs):
            for index, text in pairs:
                env.reset(options={"index": index})
                env.step(text)

        run()  # warm the per-pivot caches (compiled expert data, replayed state), as in training
        results[label] = cpu_rate(run, len(pairs), repeats)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="tool-use verifier benchmark")
    parser.add_argument(
        "--repeats", type=int, default=7, help="timed runs per measure (best CPU time is kept)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    pivots = list(bundled_pivots())
    corpus = MessageCorpus(pivots)
    actions = [
        (i, kind, eq, text)
        for i, pivot in enumerate(pivots)
        for kind, eq, text in perturbations(pivot, rng, corpus)
    ]

    quality = {
        "tau-airline, execution equivalence on": miss_rates(actions, "tau-airline"),
        "tau-airline, execution equivalence off": miss_rates(
            actions, "tau-airline", {"execution_equivalence": False}
        ),
        "recorded outputs (argument rules only)": miss_rates(actions, "recorded"),
    }
    crossed = other_conversations(pivots)
    speed = throughput([a for a in actions if a[1] not in ISSUE_35_KINDS], args.repeats)
    floor_cpu = speed["floor_json_loads"][0]

    print(f"tool-use verifier benchmark: {len(pivots)} pivots, {len(actions)} perturbed actions")
    print()
    print(f"{'setting':42s} {'miss rate':>10s} {'accepted':>9s} {'acc. wrong':>11s} {'rej. equiv.':>12s}")
    for setting, q in quality.items():
        print(
            f"{setting:42s} {q['miss_rate']:10.3f} {q['functional_accepts']:9d} "
            f"{q['accepted_but_meant_wrong']:11d} {q['rejected_but_meant_equivalent']:12d}"
        )
    print()
    print(f"{'perturbation':34s} {'n':>5s} {'functional=1':>13s} {'(recorded)':>11s} {'strict=1':>9s}")
    recorded = quality["recorded outputs (argument rules only)"]["by_kind"]
    for kind, c in quality["tau-airline, execution equivalence on"]["by_kind"].items():
        print(
            f"{kind:34s} {c['n']:5d} {c['functional']:13d} {recorded[kind]['functional']:11d} {c['strict']:9d}"
        )
    print(
        f"\nanother conversation's expert message, all {crossed['pairs']:,} pairs: accepted "
        f"{crossed['accepted']} ({100 * crossed['share']:.2f}%)"
    )
    print()
    print(
        f"{'throughput (1 core)':32s} {'steps/s CPU':>12s} {'steps/s wall':>13s} {'vs floor':>9s} {'target':>8s}"
    )
    targets = {
        "floor_json_loads": None,
        "verify_only_recorded": None,
        "with_execution_tau_airline": None,
        "verify_only_recorded_no_copies": 20000,
        "with_execution_tau_airline_no_copies": 5000,
    }
    for label, (cpu, wall) in speed.items():
        target = targets.get(label)
        print(f"{label:32s} {cpu:12,.0f} {wall:13,.0f} {cpu / floor_cpu:9.3f} {target or '-':>8}")

    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "pivots": len(pivots),
                "actions": len(actions),
                "quality": quality,
                "another_conversations_message": crossed,
                "throughput_steps_per_s": {
                    k: {"cpu": v[0], "wall": v[1], "ratio_to_floor": v[0] / floor_cpu}
                    for k, v in speed.items()
                },
                "targets_steps_per_s": targets,
                "machine": {
                    "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine(),
                },
                "repeats": args.repeats,
            },
            indent=2,
        )
    )
    print(f"\nwrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
