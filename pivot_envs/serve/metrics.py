"""The server's counters, rendered in Prometheus' text format for `/metrics` (no client library:
a handful of counters and one latency histogram)."""

from __future__ import annotations

import bisect
from collections import Counter, deque

# Step latency bucket bounds in seconds: tool-use steps take well under a millisecond, sandboxed
# steps tens of milliseconds to the command timeout.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WINDOW = 4096  # the recent steps the p50/p99 gauges are taken over


class Metrics:
    """Request counts by route and status, and the latency of each env step (reset + step)."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self.bucket_counts = [0] * (len(BUCKETS) + 1)
        self.step_sum = 0.0
        self.step_count = 0
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.queue_timeouts = 0

    def count_request(self, method: str, route: str, status: int) -> None:
        self.requests[(method, route, status)] += 1

    def observe_step(self, seconds: float) -> None:
        self.bucket_counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.step_sum += seconds
        self.step_count += 1
        self.recent.append(seconds)

    def quantile(self, q: float) -> float:
        """The q-quantile of the recent step latencies in seconds (0.0 before any step)."""
        if not self.recent:
            return 0.0
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def render(self, sessions: int, envs: int, queue: int, max_sessions: int) -> str:
        """The metrics as Prometheus text (exposition format 0.0.4)."""
        lines = [
            "# HELP pivot_serve_sessions_open Sessions open now.",
            "# TYPE pivot_serve_sessions_open gauge",
            f"pivot_serve_sessions_open {sessions}",
            "# HELP pivot_serve_envs_alive Envs alive now (sessions', /verify calls' and idle ones).",
            "# TYPE pivot_serve_envs_alive gauge",
            f"pivot_serve_envs_alive {envs}",
            "# HELP pivot_serve_max_sessions Envs allowed alive at once (--max-sessions).",
            "# TYPE pivot_serve_max_sessions gauge",
            f"pivot_serve_max_sessions {max_sessions}",
            "# HELP pivot_serve_queue_length Requests waiting for a free env now.",
            "# TYPE pivot_serve_queue_length gauge",
            f"pivot_serve_queue_length {queue}",
            "# HELP pivot_serve_queue_timeouts_total Requests answered 503 after waiting --queue-timeout.",
            "# TYPE pivot_serve_queue_timeouts_total counter",
            f"pivot_serve_queue_timeouts_total {self.queue_timeouts}",
            "# HELP pivot_serve_requests_total HTTP requests answered, by method, route and status.",
            "# TYPE pivot_serve_requests_total counter",
        ]
        for (method, route, status), count in sorted(self.requests.items()):
            lines.append(
                f'pivot_serve_requests_total{{method="{method}",route="{route}",status="{status}"}} {count}'
            )
        lines += [
            "# HELP pivot_serve_step_seconds Time of one env step on the server (reset and step, in the thread pool).",
            "# TYPE pivot_serve_step_seconds histogram",
        ]
        cumulative = 0
        for bound, count in zip((*BUCKETS, float("inf")), self.bucket_counts):
            cumulative += count
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'pivot_serve_step_seconds_bucket{{le="{le}"}} {cumulative}')
        lines += [
            f"pivot_serve_step_seconds_sum {self.step_sum:.6f}",
            f"pivot_serve_step_seconds_count {self.step_count}",
            f"# HELP pivot_serve_step_latency_seconds Step latency quantiles over the last {WINDOW} steps.",
            "# TYPE pivot_serve_step_latency_seconds gauge",
            f'pivot_serve_step_latency_seconds{{quantile="0.5"}} {self.quantile(0.5):.6f}',
            f'pivot_serve_step_latency_seconds{{quantile="0.99"}} {self.quantile(0.99):.6f}',
        ]
        return "\n".join(lines) + "\n"
