"""What `pivotrl reproduce` measures on a policy: per-item results, so arms can be paired item by item.

- `turn_rewards`: the greedy action's functional reward at each held-out pivot (None where the
  env failed), scored by the domain's own env and its default (functional) verifier.
- `text_losses`: the mean negative log-likelihood per token of fixed Wikipedia summaries from the
  search corpus that no search task uses (general English the training never saw).
- `question_scores`: 1 or 0 per bundled general question (arithmetic and short facts with exact
  answers, data/general_questions.jsonl): the normalised answer appears as a whole word in the
  greedy reply.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pivot_envs.evaluate import generate_all
from pivot_envs.pivot import Pivot
from pivot_envs.policy import SamplingParams
from pivot_envs.scoring import EnvPool, resolve_env

QUESTIONS = Path(__file__).parent / "data" / "general_questions.jsonl"
ENV_WORKERS = 2


def load_policy(spec: str, device: str, max_prompt_tokens: int) -> Any:
    """The policy a scale starts from: `spec` through the policy registry, or, for "tiny", a randomly
    initialised two-layer model of SmolLM2's architecture with SmolLM2's tokenizer (seeded: the same
    weights every time)."""
    from pivot_envs.adapters.reproduce.scales import TINY

    if spec != TINY:
        from pivot_envs.cli._checks import load_named_policy

        return load_named_policy(spec, device=device, max_prompt_tokens=max_prompt_tokens)
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from pivot_envs.adapters import smollm2
    from pivot_envs.adapters.policies.hf import HFPolicy

    tokenizer = AutoTokenizer.from_pretrained(smollm2.checkpoint())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_prompt_tokens + 256,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
    )
    return HFPolicy(
        LlamaForCausalLM(config).eval(),
        tokenizer,
        device=device,
        name="hf:tiny",
        max_prompt_tokens=max_prompt_tokens,
    )


def greedy(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, seed=0)


def turn_rewards(
    policy: Any,
    pivots: Sequence[Pivot],
    max_new_tokens: int,
    progress: str | None = None,
    **env_kwargs: Any,
) -> list[float | None]:
    """The functional reward of the greedy action at each pivot (one domain's), None where the env failed; with
    `progress`, a progress bar of that title over the generation."""
    if not pivots:
        return []
    completions = generate_all(
        policy, list(pivots), 1, greedy(max_new_tokens), batch_size=8, progress=progress
    )
    with EnvPool(resolve_env(None, list(pivots), **env_kwargs), ENV_WORKERS) as pool:
        scores = pool.score([(pivot.id, group[0].action) for pivot, group in zip(pivots, completions)])
    return [score.reward if score.valid else None for score in scores]


@functools.lru_cache(maxsize=4)
def wikipedia_texts(count: int, seed: int = 0) -> tuple[str, ...]:
    """`count` summaries of the search corpus that no bundled search task names (as evidence, in its
    question or in its answers), a seeded sample in a fixed order (read once per process); () when the corpus is not installed."""
    from pivot_envs.domains.search.corpus import CorpusError, read_corpus
    from pivot_envs.domains.search.tasks import read_tasks

    used_titles: set[str] = set()
    mentioned = []
    for task in read_tasks():
        used_titles.update(title.lower() for title in task.evidence)
        mentioned.append(task.question.lower())
        mentioned.extend(answer.lower() for answer in task.answers)
    joined = "\n".join(mentioned)
    try:
        documents = [
            doc
            for doc in read_corpus()
            if doc.title.lower() not in used_titles
            and doc.title.lower() not in joined
            and len(doc.text) > 200
        ]
    except CorpusError:
        return ()
    documents.sort(key=lambda doc: doc.docid)
    return tuple(doc.text for doc in random.Random(seed).sample(documents, min(count, len(documents))))


def text_losses(policy: Any, texts: Sequence[str], max_tokens: int) -> list[float]:
    """The mean negative log-likelihood per token of each text's first `max_tokens` tokens under the policy's model."""
    import torch

    model, tokenizer = policy.model, policy.tokenizer
    device = next(model.parameters()).device
    losses = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
            batch = torch.tensor([ids], dtype=torch.long, device=device)
            losses.append(float(model(input_ids=batch, labels=batch).loss))
    return losses


def read_questions(count: int) -> list[dict[str, str]]:
    """The bundled general questions (all of them when count is 0, else the first `count`, arithmetic and QA alternating)."""
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    if count <= 0 or count >= len(rows):
        return rows
    arithmetic = [row for row in rows if row["kind"] == "arithmetic"]
    facts = [row for row in rows if row["kind"] != "arithmetic"]
    mixed = [row for pair in zip(arithmetic, facts) for row in pair]
    return mixed[:count]


def normalise(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def answer_found(reply: str, answer: str) -> bool:
    """Whether the normalised answer is a whole-word part of the normalised reply."""
    return f" {normalise(answer)} " in f" {normalise(reply)} "


def question_replies(policy: Any, questions: Sequence[dict[str, str]], max_new_tokens: int = 16) -> list[str]:
    """The greedy reply to each question, in order."""
    chats = [{"messages": [{"role": "user", "content": q["question"]}]} for q in questions]
    replies = []
    for start in range(0, len(chats), 8):
        groups = policy.generate(chats[start : start + 8], 1, greedy(max_new_tokens))
        replies += [group[0].text for group in groups]
    return replies


def question_scores(
    policy: Any, questions: Sequence[dict[str, str]], max_new_tokens: int = 16
) -> list[float]:
    """1.0 or 0.0 per question: the greedy reply holds the exact answer."""
    replies = question_replies(policy, questions, max_new_tokens)
    return [1.0 if answer_found(reply, q["answer"]) else 0.0 for q, reply in zip(questions, replies)]
