"""The generation of one comparison as views: what runs inside a ZeroGPU call (zerogpu.py) and, off
ZeroGPU, on the studio's model thread (callbacks.py)."""

from __future__ import annotations

from ..compare import compare_stream
from ..config import DecodeConfig, RuleConfig
from ..record import record_of
from . import views

LOSSLESS = RuleConfig("lossless")


def stream_comparison(engine, prompt: str, decode: DecodeConfig, rule: RuleConfig, run_ar: bool):
    """The generation itself (what runs inside a ZeroGPU call): partial views while both columns
    grow, then the RunRecord (plain data, nothing on the device)."""
    state, shown = None, set()
    for state in compare_stream(engine, prompt, decode, rule, run_ar):
        update = {"lossless_out": views.column_html(state.lossless, engine, decode, LOSSLESS),
                  "lossy_out": views.column_html(state.lossy, engine, decode, rule)}
        update.update(views.early_stats(state, shown))
        if state.phase == "peer":
            update["status"] = "Both runs done, and the baseline; running transformers' own static ensemble (the peer) …"
        if state.phase == "baseline":
            update["status"] = ("Both runs done (their numbers are in); measuring the autoregressive baseline "
                                "for the speedup …")
        yield update
    yield record_of(state, engine)
