"""The LLM judge: documented prompt, robust verdict parsing, greedy judging, a cache by (pivot, action)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pivot_envs.chat import tool_call
from pivot_envs.judge import JUDGE_PROMPT, JudgedVerifier, JudgeVerifier, parse_verdict, render_action
from pivot_envs.pivot import Pivot
from pivot_envs.policy import Completion
from pivot_envs.verifiers import StrictVerifier, Verifier


def airline_pivot(with_call: bool = True) -> Pivot:
    from pivot_envs.domains.tool_use.env import bundled_pivots

    return next(p for p in bundled_pivots() if bool(p.expert.get("tool_calls")) == with_call)


class RuleJudge:
    """A judge policy that follows the prompt's rule literally: accept iff the candidate equals the expert.

    Candidates whose text contains 'hmm' get an answer without a verdict line.
    """

    name = "rule-judge"

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.samplings = []

    def generate(self, chats, n, sampling):
        self.calls.append(len(chats))
        self.samplings.append(sampling)
        out = []
        for chat in chats:
            prompt = chat["messages"][0]["content"]
            expert = re.search(r"## Expert action\n(.*?)\n\n## Candidate action", prompt, re.S).group(1)
            candidate = re.search(r"## Candidate action\n(.*?)\n\nThink briefly", prompt, re.S).group(1)
            if "hmm" in candidate:
                answer = "It is hard to say."
            else:
                answer = "Both do the same.\n**Verdict:** " + ("ACCEPT" if candidate == expert else "REJECT")
            out.append([Completion(answer) for _ in range(n)])
        return out


class DownJudge:
    name = "down"

    def generate(self, chats, n, sampling):
        raise ConnectionError("judge endpoint http://judge:8000 refused the connection")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("VERDICT: ACCEPT", True),
        ("reasoning...\nverdict: reject", False),
        ("**Verdict**: Accept", True),
        ("VERDICT: REJECT\n...on second thought\nVERDICT: ACCEPT", True),
        ("I accept this candidate.", None),
        ("", None),
    ],
)
def test_the_verdict_is_parsed_from_the_last_verdict_line(text, expected):
    assert parse_verdict(text) is expected


def test_the_prompt_shows_state_expert_and_candidate_and_asks_for_a_verdict_line():
    pivot = airline_pivot()
    candidate = {"role": "assistant", "content": "Could you share your user id?"}
    prompt = JudgeVerifier(RuleJudge()).prompt(pivot, candidate)
    assert render_action(pivot.expert) in prompt and "message: Could you share your user id?" in prompt
    assert pivot.expert["tool_calls"][0]["function"]["name"] in prompt
    assert prompt.endswith("VERDICT: ACCEPT\nor\nVERDICT: REJECT")
    assert JUDGE_PROMPT.split("{state}")[0] in prompt


def test_the_judge_accepts_rejects_and_types_an_unreadable_answer_greedily():
    pivot, policy = airline_pivot(), RuleJudge()
    judge = JudgeVerifier(policy)
    assert isinstance(judge, Verifier)
    accepted = judge.verify(pivot, dict(pivot.expert))
    rejected = judge.verify(pivot, {"role": "assistant", "content": "Goodbye."})
    unreadable = judge.verify(pivot, {"role": "assistant", "content": "hmm, let me think"})
    assert (accepted.reward, accepted.category, accepted.valid) == (1.0, "judge_accept", True)
    assert (rejected.reward, rejected.category, rejected.valid) == (0.0, "judge_reject", True)
    assert (unreadable.reward, unreadable.category, unreadable.valid) == (0.0, "judge_unparseable", False)
    assert all(s.temperature == 0.0 for s in policy.samplings)


def test_verdicts_are_cached_by_pivot_and_canonical_action():
    pivot, policy = airline_pivot(), RuleJudge()
    judge = JudgeVerifier(policy)
    call = pivot.expert["tool_calls"][0]["function"]
    arguments = json.loads(call["arguments"])
    reordered = json.dumps(dict(reversed(list(arguments.items()))), indent=2)
    judge.verify(pivot, dict(pivot.expert))
    same = judge.verify(
        pivot, {"role": "assistant", "content": None, "tool_calls": [tool_call(call["name"], reordered, "x")]}
    )
    assert same.category == "judge_accept" and policy.calls == [1]


def test_several_uncached_pairs_are_judged_in_one_generate_call():
    pivot, policy = airline_pivot(), RuleJudge()
    judge = JudgeVerifier(policy)
    actions = [{"role": "assistant", "content": f"answer {i}"} for i in range(5)]
    verdicts = judge.judge_many([(pivot, a) for a in actions] + [(pivot, actions[0])])
    assert policy.calls == [5] and [v.category for v in verdicts] == ["judge_reject"] * 6


def test_a_persisted_cache_is_read_back_and_a_cut_last_line_is_ignored(tmp_path: Path):
    pivot, path = airline_pivot(), tmp_path / "verdicts.jsonl"
    JudgeVerifier(RuleJudge(), cache_path=path).verify(pivot, dict(pivot.expert))
    JudgeVerifier(RuleJudge(), cache_path=path).verify(pivot, {"role": "assistant", "content": "No."})
    assert len(path.read_text().splitlines()) == 2
    with path.open("a") as handle:
        handle.write('{"pivot": "x", "act')
    offline = JudgeVerifier(DownJudge(), cache_path=path)
    assert offline.verify(pivot, dict(pivot.expert)).category == "judge_accept"
    assert offline.verify(pivot, {"role": "assistant", "content": "No."}).category == "judge_reject"


def test_an_unreachable_judge_gives_an_invalid_verdict_that_is_not_cached():
    pivot = airline_pivot()
    judge = JudgeVerifier(DownJudge())
    verdict = judge.verify(pivot, dict(pivot.expert))
    assert (verdict.valid, verdict.category) == (
        False,
        "judge_error",
    ) and "http://judge:8000" in verdict.detail
    judge._policy = RuleJudge()
    assert judge.verify(pivot, dict(pivot.expert)).category == "judge_accept"


def test_the_judge_decides_only_what_the_functional_verifier_rejected():
    pivot, policy = airline_pivot(), RuleJudge()
    combined = JudgedVerifier(StrictVerifier(), JudgeVerifier(policy))
    exact = combined.verify(pivot, dict(pivot.expert))
    assert exact.category == "exact_match" and policy.calls == []
    other = combined.verify(pivot, {"role": "assistant", "content": "Goodbye."})
    assert other.category == "judge_reject" and other.extra["functional"]["category"] == "not_exact_match"
    only_messages = JudgedVerifier(StrictVerifier(), JudgeVerifier(policy), categories=["message_mismatch"])
    assert only_messages.verify(pivot, {"role": "assistant", "content": "Bye."}).category == "not_exact_match"


def test_smollm2_as_judge_gives_a_typed_deterministic_verdict_on_a_real_pivot():
    import torch

    torch.set_num_threads(1)  # the test machine's cores are shared: one thread is much faster there
    pivot = airline_pivot(with_call=False)
    candidate = {"role": "assistant", "content": "Please tell me your user id and reservation id."}
    first = JudgeVerifier("hf:smollm2", max_new_tokens=48, max_state_chars=1200)
    verdict = first.verify(pivot, candidate)
    assert verdict.category in {"judge_accept", "judge_reject", "judge_unparseable"}
    assert verdict.valid == (verdict.category != "judge_unparseable")
    again = JudgeVerifier(first.policy, max_new_tokens=48, max_state_chars=1200).verify(pivot, candidate)
    assert (again.category, again.detail) == (verdict.category, verdict.detail)
