"""Each terminal env owns its sandboxes: closing one (or an evaluation's) never touches another's."""

from __future__ import annotations

import threading
from pathlib import Path

from terminal_leftovers import left_behind

from pivot_envs.domains.terminal import TerminalEnv
from pivot_envs.evaluate import EvalConfig, evaluate
from pivot_envs.policy import Completion
from pivot_envs.sandboxes.cleanup import owner_alive, owner_id

PIVOT = "terminal/sed-config-port/t1"
THREADS = 8


def made_by(env: TerminalEnv) -> tuple[str | None, list[Path]]:
    """The owner label and the directories of an env's open backend (for `left_behind` after it closes)."""
    return getattr(env.backend, "owner", None), [env.backend.root] if env.backend.root is not None else []


def test_envs_in_eight_threads_close_at_staggered_times_without_touching_each_other(kind):
    envs = [TerminalEnv(sandbox=kind, warm_pool=1, prefix_cache=2) for _ in range(THREADS)]
    steps: list[tuple[int, float, bool, str]] = []
    failures: list[tuple[int, str]] = []
    made: dict[int, tuple[str | None, list[Path]]] = {}
    start = threading.Barrier(THREADS)

    def work(index: int) -> None:
        env = envs[index]
        try:
            start.wait()
            # Thread i closes its env after 2 + i samples: the later threads step while the earlier close.
            for _ in range(2 + index):
                env.reset(options={"pivot": PIVOT})
                made.setdefault(index, made_by(env))
                _, reward, _, _, info = env.step(env.pivot.expert)
                steps.append((index, reward, info["valid"], info["detail"]))
            env.close()
        except Exception as error:
            failures.append((index, repr(error)))

    threads = [threading.Thread(target=work, args=(index,)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(steps) == sum(2 + index for index in range(THREADS))
    assert [step for step in steps if step[1:3] != (1.0, True)] == []
    assert len({(owner, tuple(roots)) for owner, roots in made.values()}) == THREADS  # each env its own
    for owner, roots in made.values():
        assert left_behind(owner, roots) == []


def test_an_evaluation_closing_its_envs_leaves_a_training_env_working(kind):
    training = TerminalEnv(sandbox=kind, warm_pool=1)
    training.reset(options={"pivot": PIVOT})
    assert training.step(training.pivot.expert)[4]["valid"]
    held_out = [pivot for pivot in training.pivots if pivot.id == PIVOT]
    report = evaluate(
        ExpertPolicy(held_out[0].expert), held_out, EvalConfig(num_envs=2), sandbox=kind, warm_pool=1
    )
    assert (report.row("terminal").functional.mean, report.row("terminal").invalid) == (1.0, 0)
    for _ in range(
        2
    ):  # after the evaluation closed its envs: the training env's snapshot and warm forks are there
        training.reset(options={"pivot": PIVOT})
        _, reward, _, _, info = training.step(training.pivot.expert)
        assert (reward, info["valid"]) == (1.0, True), info["detail"]
    assert training.prefixes.builds == 1
    owner, roots = made_by(training)
    training.close()
    assert left_behind(owner, roots) == []


def test_owners_differ_per_backend_and_name_the_process_gc_judges_by():
    first, second = owner_id(), owner_id()
    assert first != second
    host, pid, _ = first.split(":")
    assert owner_alive(first) and owner_alive(f"{host}:{pid}")  # the form older versions labelled with
    assert not owner_alive(f"{host}:999999999:{first.split(':')[2]}")


class ExpertPolicy:
    """A policy that answers every chat with one fixed assistant message (the expert's)."""

    name = "expert"

    def __init__(self, message: dict) -> None:
        self.message = message

    def generate(self, chats: list, n: int, sampling: object) -> list[list[Completion]]:
        return [[Completion(text="", message=self.message) for _ in range(n)] for _ in chats]
