"""A finished run as the browser's replay plays it: per column, every round's drafted tokens with
their numbers, the verdict per slot, the token that lands, and the round's measured time.

Pure functions of a RunRecord. The player (assets/replay.js) runs in the page from this payload
alone: no model, no server round trip per frame.
"""

from __future__ import annotations

import html
import json

from .decoding.acceptance import REASONS, votes_needed
from .decoding.config import RuleConfig
from .lessons import rule_reasons
from .metrics import summarize
from .runfile import RunRecord
from .render import kind_label, palette, tooltip
from .rule_words import column_title, drafted_by
from .decoding.trace import DraftedToken, GenerationTrace, RoundTrace

PAYLOAD_VERSION = 1


def replay_payload(record: RunRecord, title: str = "") -> dict:
    """{"title", "columns": [lossless, lossy], "legend"}: everything the player shows."""
    return {
        "version": PAYLOAD_VERSION,
        "title": title,
        "columns": [column_payload(record.lossless, "Lossless SD", record),
                    column_payload(record.lossy, column_title(record.rule), record, lossless=record.lossless)],
        "legend": {kind: {"label": kind_label(kind), "cue": cue, "lossy": kind in REASONS and REASONS[kind].lossy}
                   for kind, (_, _, cue) in palette().items()},
    }


def column_payload(trace: GenerationTrace, label: str, record: RunRecord,
                   lossless: GenerationTrace | None = None) -> dict:
    """One column: its first token, its rounds, and the run's own metrics the counters must end at."""
    stop_ids = frozenset(trace.output_ids[-1:]) if trace.stop_reason == "eos" else frozenset()
    metrics = summarize(trace, record.alone_tokens_per_s, lossless=lossless)
    return {
        "label": label,
        "rule": trace.rule,
        # what the replay's lesson mode asks the learner to choose from at each checked slot
        "choices": [{"reason": reason, "label": kind_label(reason)} for reason in rule_reasons(trace.rule)],
        "prefill_s": trace.t_prefill,
        "first": None if trace.first_token in stop_ids else record.token_text(trace.first_token),
        "rounds": [round_payload(r, record, stop_ids, trace.rule_config) for r in trace.rounds],
        "text": "".join(record.token_text(t) for t in trace.output_ids if t not in stop_ids),
        "final": {"tokens": metrics.new_tokens, "calls": metrics.target_calls, "tau": metrics.tau,
                  "lossy_only": sum(REASONS[d.reason].lossy for r in trace.rounds for d in r.drafted),
                  "seconds": trace.t_prefill + sum(r.t_round for r in trace.rounds)},
    }


def round_payload(r: RoundTrace, record: RunRecord, stop_ids: frozenset[int], knobs: RuleConfig) -> dict:
    """One round: its drafts (each with the verdict and why), the emitted tokens (the accepted drafts, then the
    correction or bonus, as RoundTrace.emitted holds them), its times."""
    extra = (f"round {r.index}: correction, the clean target's token after slot {r.num_accepted + 1} was rejected"
             if r.extra_kind == "correction" else
             f"round {r.index}: bonus, every drafted token was accepted; the target adds one more")
    accepted = [(d.reason, tooltip(d, record.token_text, r.index, r.draft_source)) for d in r.drafted[: r.num_accepted]]
    emitted = [{"x": "" if token in stop_ids else record.token_text(token), "kind": kind, "tip": tip}
               for token, (kind, tip) in zip(r.emitted, [*accepted, (r.extra_kind, extra)])]
    return {
        "index": r.index,
        "source": r.draft_source,
        "drafted_by": drafted_by(r.draft_source),
        "t_round": r.t_round,
        "t_draft": r.t_draft,
        "accepted": r.num_accepted,
        "extra": r.extra_kind,
        "drafted": [slot_payload(d, record, knobs) for d in r.drafted],
        "emitted": emitted,
    }


def slot_payload(d: DraftedToken, record: RunRecord, knobs: RuleConfig) -> dict:
    """A drafted token: its text, q, the clean target's view, the paths' view, and the verdict."""
    found = {"x": record.token_text(d.token), "q": d.draft_prob, "reason": d.reason, "verdict": kind_label(d.reason),
             "target": record.token_text(d.target_token), "p_target_top": d.target_token_prob, "p": d.target_prob}
    if d.path_tokens:
        found.update(paths=[record.token_text(t) for t in d.path_tokens], js=d.js, threshold=d.threshold,
                     votes=d.draft_votes, needed=votes_needed(len(d.path_tokens), knobs.majority_fraction))
    return found


def replay_html(record: RunRecord | None, title: str = "") -> str:
    """The element the player mounts on, its payload in a data attribute (escaped: no markup runs)."""
    if record is None:
        return '<div class="dm-replay-empty">Run a comparison or open a recorded run: its replay appears here.</div>'
    payload = json.dumps(replay_payload(record, title), separators=(",", ":"))
    return f'<div class="dm-replay" data-run="{html.escape(payload, quote=True)}"></div>'
