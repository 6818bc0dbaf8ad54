"""The engine's one timing observer: a round marks its phase boundaries and reads them once.

    timer = PhaseTimer(device)
    timer.mark("start"); ...; timer.mark("drafted"); ...; timer.mark("end")
    seconds = timer.read()          # {"start": 0.0, "drafted": ..., "end": ...}: seconds since the first mark

On CUDA a mark records an event on the current stream (no host sync) and `read` waits once, for the
last one: a round's timings cost one synchronize, not one per phase. Elsewhere (CPU) a mark reads
`perf_counter`: there is nothing queued to wait for.
"""

from __future__ import annotations

import time
from typing import Callable

import torch


class PhaseTimer:
    """Named marks of one stretch of work (a round, a prefill, a timed call), read once."""

    def __init__(self, device: torch.device | str):
        self.on_cuda = torch.device(device).type == "cuda"
        self.marks: dict[str, object] = {}

    def mark(self, name: str) -> None:
        if self.on_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def read(self) -> dict[str, float]:
        """Seconds from the first mark to each mark (one synchronize on CUDA); {} before any mark."""
        if not self.marks:
            return {}
        first = next(iter(self.marks.values()))
        if not self.on_cuda:
            return {name: at - first for name, at in self.marks.items()}
        last = next(reversed(self.marks.values()))
        last.synchronize()
        return {name: first.elapsed_time(event) / 1000.0 for name, event in self.marks.items()}

    def between(self, start: str, end: str, seconds: dict[str, float] | None = None) -> float:
        """Seconds from mark `start` to mark `end` (0.0 where either was not marked)."""
        seconds = self.read() if seconds is None else seconds
        return seconds[end] - seconds[start] if start in seconds and end in seconds else 0.0


def best_seconds(device: torch.device | str, repeats: int, work: Callable[[], object],
                 reset: Callable[[], object] = lambda: None) -> float:
    """The fastest of `repeats` timed calls of work() (reset() after each, untimed): a step's cost as gamma =
    auto prices it, the least disturbed by whatever else the machine runs."""
    times = []
    for _ in range(repeats):
        timer = PhaseTimer(device)
        timer.mark("start")
        work()
        timer.mark("end")
        times.append(timer.between("start", "end"))
        reset()
    return min(times)
