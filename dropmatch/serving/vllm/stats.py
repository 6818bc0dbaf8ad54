"""DropMatch's counters in a vLLM server: each worker writes why its re-verified draft tokens ended as
they did (exact, js, majority, ..., rejected, unchecked) to a small JSON file in one folder; the API
server's /metrics reads the folder (a Prometheus collector, registered by register()), since the
workers are other processes than the one that serves /metrics.

    dropmatch_draft_tokens_total{reason="majority"} 12.0
    dropmatch_lossy_accepted_tokens_total 31.0
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

STATS_DIR_ENV = "DROPMATCH_VLLM_STATS_DIR"


def stats_dir() -> Path:
    """The folder of this server's counters: $DROPMATCH_VLLM_STATS_DIR, set (to a new temporary
    folder) by the first process that asks, so that the workers it starts inherit it."""
    if not os.environ.get(STATS_DIR_ENV):
        os.environ[STATS_DIR_ENV] = tempfile.mkdtemp(prefix="dropmatch-vllm-")
    return Path(os.environ[STATS_DIR_ENV])


class StatsFile:
    """One worker's counts, rewritten whole (atomically). The serving step only counts: a writer
    thread rewrites the file within `every` seconds of a change, so no file I/O waits in a step."""

    def __init__(self, path: Path, every: float = 0.2):
        self.path = path
        self.every = every
        self.reasons: Counter = Counter()
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.writer: threading.Thread | None = None

    @classmethod
    def for_this_process(cls) -> "StatsFile":
        """This worker's file in the folder /metrics reads (worker-*.json: read_counts)."""
        return cls(stats_dir() / f"worker-{os.getpid()}.json")

    def add(self, reasons) -> None:
        with self.lock:
            self.reasons.update(reasons)

    def write(self) -> None:
        with self.lock:
            text = json.dumps(dict(self.reasons))
        staging = self.path.with_suffix(".tmp")
        staging.write_text(text)
        os.replace(staging, self.path)

    def write_soon(self) -> None:
        """The counts reach the file within `every` seconds, written by this worker's writer thread."""
        self.changed.set()
        if self.writer is None:
            self.writer = threading.Thread(target=self._keep_writing, name="dropmatch-stats", daemon=True)
            self.writer.start()

    def _keep_writing(self) -> None:
        while True:
            self.changed.wait()
            time.sleep(self.every)  # the steps of the next `every` seconds go into the same write
            self.changed.clear()
            try:
                self.write()
            except OSError:  # the folder went away (the server is stopping): nothing left to report to
                return


def read_counts(folder: Path | None = None) -> Counter:
    """The reasons counted by every worker of this server."""
    total: Counter = Counter()
    for path in sorted((folder or stats_dir()).glob("worker-*.json")):
        try:
            total.update(json.loads(path.read_text()))
        except (OSError, ValueError):  # a worker mid-write: its last whole file is read next time
            continue
    return total


class DropMatchCollector:
    """A prometheus_client collector over read_counts()."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        from ...decoding.acceptance import lossy_reasons

        counts = read_counts()
        tokens = CounterMetricFamily("dropmatch_draft_tokens", "Draft tokens DropMatch re-verified, by why they "
                                     "ended as they did", labels=["reason"])
        for reason, count in sorted(counts.items()):
            tokens.add_metric([reason], float(count))
        yield tokens
        lossy = CounterMetricFamily("dropmatch_lossy_accepted_tokens", "Draft tokens accepted only by a lossy rule")
        lossy.add_metric([], float(sum(counts[reason] for reason in lossy_reasons())))
        yield lossy
