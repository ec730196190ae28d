"""Resumable stages: each writes its result once it is done, and a rerun reads it instead of running it.

A stage named N works in OUT/stages/N.partial/ and, when its function returns, writes the result
into it as result.json and renames the folder to OUT/stages/N/. A rerun finds OUT/stages/N/result.json
and returns it without running anything. An interrupted stage leaves only N.partial/, which the
next run deletes and starts over: no stage ever resumes from half its work. A finished stage whose
recorded settings differ from this run's is run again (its folder is replaced).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError

log = logging.getLogger(__name__)


class StageMismatchError(PivotEnvsError, RuntimeError):
    """A finished stage, run again to restore its files, gave another result than the one recorded."""


def machine() -> dict[str, str]:
    """What a stage's numbers depend on beyond its settings: torch's version, the CPU kernels torch picked
    (`torch.backends.cpu.get_cpu_capability()`: "avx2", "avx512", ...; ATEN_CPU_CAPABILITY sets them) and
    the CPU, whose model also decides MKL's matrix kernels (MKL_ENABLE_INSTRUCTIONS caps them). The same
    seed repeats bit for bit only with the same kernels. Empty where torch was never imported."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    return {
        "torch": str(torch.__version__),
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "cpu": _cpu_model(),
    }


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def digest(settings: Any) -> str:
    """A short stable digest of JSON-able settings."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Stages:
    """The stages of one output folder; `computed` and `reused` list the names run and read by this object."""

    def __init__(self, out: Path) -> None:
        self.root = Path(out) / "stages"
        self.root.mkdir(parents=True, exist_ok=True)
        self.computed: list[str] = []
        self.reused: list[str] = []

    def folder(self, name: str) -> Path:
        """Where a finished stage keeps its files (weights, logs) beside result.json."""
        return self.root / name

    def _record(self, name: str, settings: Any) -> dict[str, Any] | None:
        """Stage `name`'s record when it finished earlier with these `settings`, else None."""
        done = self.root / name / "result.json"
        if not done.exists():
            return None
        record = json.loads(done.read_text())
        if record.get("settings_digest") == digest(settings):
            return record
        log.info("stage %s: finished with other settings", name)
        return None

    def finished(self, name: str, settings: Any) -> bool:
        """Whether stage `name` finished earlier with these `settings` (so `run` would read it)."""
        return self._record(name, settings) is not None

    def run(self, name: str, settings: Any, work: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
        """The result of stage `name`: read when it finished earlier with the same `settings`, else
        `work(folder)` run in a fresh folder and recorded. The result must be JSON-able."""
        record = self._record(name, settings)
        if record is not None:
            self.reused.append(name)
            return record["result"]
        partial = self._fresh(name)
        began = time.perf_counter()
        print(f"[reproduce] stage {name} ...", flush=True)
        result = work(partial)
        seconds = time.perf_counter() - began
        self._finish(
            name,
            partial,
            {
                "settings_digest": digest(settings),
                "settings": settings,
                "seconds": seconds,
                "result": result,
                "machine": machine(),
            },
        )
        print(f"[reproduce] stage {name} done in {seconds:.0f} s", flush=True)
        return result

    def rebuild(self, name: str, settings: Any, work: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
        """Run finished stage `name` again to restore files its folder lacks (a run's stages/ copied to another
        machine without the base's weights), and check that it gives the recorded result: the stages built on
        the recorded files must not be mixed with others. Raises StageMismatchError when it does not."""
        record = self._record(name, settings)
        if record is None:
            return self.run(name, settings, work)
        print(f"[reproduce] stage {name}: rebuilding its files ...", flush=True)
        partial = self._fresh(name)
        began = time.perf_counter()
        result = json.loads(json.dumps(work(partial), default=str))
        if result != record["result"]:
            shutil.rmtree(partial, ignore_errors=True)
            here = machine().get("cpu_capability", "unknown")
            recorded = record.get("machine", {}).get("cpu_capability")
            kernels = (
                f"It was recorded with the {recorded} CPU kernels and rebuilt with {here}"
                if recorded
                else f"It was rebuilt with the {here} CPU kernels (its record does not name its own)"
            )
            raise StageMismatchError(
                f"stage {name} rebuilt on this machine gives {result}, not the recorded {record['result']}: the "
                f"stages built on its recorded files came from other ones. {kernels}: the same seed repeats bit "
                "for bit only with the same kernels, torch's (ATEN_CPU_CAPABILITY sets them) and MKL's (the CPU's "
                "model picks them; MKL_ENABLE_INSTRUCTIONS caps them), so rebuild on a CPU like the recording "
                f"one's (docs/reproduce.md), or delete {self.root} to start over"
            )
        seconds = time.perf_counter() - began
        self._finish(name, partial, {**record, "rebuilt_seconds": seconds})
        print(f"[reproduce] stage {name} rebuilt in {seconds:.0f} s, as recorded", flush=True)
        return result

    def _fresh(self, name: str) -> Path:
        """An empty NAME.partial folder (an interrupted attempt's is deleted: no stage resumes from half its work)."""
        partial = self.root / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        return partial

    def _finish(self, name: str, partial: Path, record: dict[str, Any]) -> None:
        """Write `record` as the stage's result.json and make its folder the finished stage's."""
        (partial / "result.json").write_text(json.dumps(record, indent=1, default=str))
        shutil.rmtree(self.root / name, ignore_errors=True)
        partial.replace(self.root / name)
        self.computed.append(name)

    def seconds(self) -> dict[str, float]:
        """Each finished stage's own running time, as recorded when it ran."""
        out = {}
        for path in sorted(self.root.glob("*/result.json")):
            out[path.parent.name] = json.loads(path.read_text()).get("seconds", 0.0)
        return out
