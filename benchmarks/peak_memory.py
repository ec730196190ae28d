"""Peak memory of a measured block, shared by the benchmarks: the CUDA allocator's peak on a GPU,
the resident-set growth sampled every 2 ms on the CPU."""

from __future__ import annotations

import os
import threading
import time


class PeakMemory:
    """Peak memory during a block: CUDA allocator peak, or resident-set growth sampled every 2 ms on CPU."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.peak = 0

    def __enter__(self) -> PeakMemory:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = _rss()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss() - self.base)
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, _rss() - self.base)


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def best_time_and_peak(fn, device: str, repeats: int) -> tuple[float, int]:
    """Run `fn` `repeats` times: the best wall time (seconds) and the largest peak memory (bytes)."""
    import torch

    times, peak = [], 0
    for _ in range(repeats):
        with PeakMemory(device) as memory:
            started = time.perf_counter()
            fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        peak = max(peak, memory.peak)
    return min(times), peak
