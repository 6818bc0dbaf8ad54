"""The generation of one comparison as views: what runs inside a ZeroGPU call (zerogpu.py) and, off
ZeroGPU, on the host's model thread (callbacks.py)."""

from __future__ import annotations

from ..decoding.acceptance import BASELINE, RULES
from ..compare import compare_stream
from ..decoding.config import DecodeConfig, RuleConfig
from ..runfile import record_of
from . import views

LOSSLESS = RuleConfig(BASELINE)


class Reading:
    """How far each column's target has read the prompt: written on the model thread as it reads
    (`read`, compare_stream's progress), said by the page's thread while it waits for a round (`note`)."""

    def __init__(self, rule: RuleConfig):
        self.names = {"lossless": "lossless SD", "lossy": RULES[rule.rule].label}
        self.now: tuple[str, int, int] | None = None  # (column, tokens read, prompt tokens)
        self.said: tuple[str, int, int] | None = None

    def read(self, column: str, done: int, total: int) -> None:
        self.now = (column, done, total)

    def note(self) -> str | None:
        """The status line while a prompt is being read, when it moved since the last one said."""
        now = self.now
        if now is None or now == self.said or now[1] >= now[2]:
            return None
        self.said = now
        column, done, total = now
        return f"Reading the prompt for {self.names[column]}: {done:,} of {total:,} tokens …"


def stream_comparison(engine, prompt: str, decode: DecodeConfig, rule: RuleConfig, run_ar: bool,
                      reading: Reading | None = None):
    """The generation itself (what runs inside a ZeroGPU call): partial views while both columns
    grow, then the RunRecord (plain data, nothing on the device). reading: told how far the prompt is read."""
    state, shown = None, set()
    progress = {} if reading is None else {"progress": reading.read}
    for state in compare_stream(engine, prompt, decode, rule, run_ar, **progress):
        update = {"lossless_out": views.column_html(state.lossless, engine, decode, LOSSLESS),
                  "lossy_out": views.column_html(state.lossy, engine, decode, rule)}
        update.update(views.early_stats(state, shown))
        if state.phase == "warm-up":
            update["status"] = "Warming up both rules on the prompt's start (untimed, so neither column pays it) …"
        if state.phase == "peer":
            update["status"] = "Both runs done, and the baseline; running transformers' own static ensemble (the peer) …"
        if state.phase == "baseline":
            update["status"] = ("Both runs done (their numbers are in); timing the target alone (the engine's "
                                "autoregressive run, then transformers' generate()) for the speedup …")
        yield update
    yield record_of(state, engine)
