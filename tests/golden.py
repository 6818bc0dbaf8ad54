"""The decisions of a run, without its timings: what a refactoring of the engine must not change.

    python tests/golden.py    # (re)records tests/data/golden_embedded.json on the embedded pair

Recorded and checked with the fast dtype pinned to float32 (GOLDEN_ENV): bf16 kernels differ between
CPUs (AMX, AVX-512 BF16), float32 agrees to rounding, and JS values are kept to 3 decimals.
"""

from __future__ import annotations

import json
from pathlib import Path

GOLDEN_FILE = Path(__file__).resolve().parent / "data" / "golden_embedded.json"
GOLDEN_ENV = {"DROPMATCH_FAST_DTYPE": "float32", "HF_HUB_OFFLINE": "1"}
GOLDEN_PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " \
                "How many clips did Natalia sell altogether?"
# (name, DecodeConfig fields, RuleConfig fields): greedy and sampling, lossless and DropMatch with paths.
GOLDEN_RUNS = [
    ("greedy_lossless", dict(gamma=4, max_new_tokens=40), dict(rule="lossless")),
    ("greedy_dropmatch", dict(gamma=4, max_new_tokens=40), dict(rule="dropmatch", p=0.1)),
    ("sampled_lossless", dict(gamma=4, max_new_tokens=40, temperature=0.8, seed=7), dict(rule="lossless")),
    # p = auto with the agreement it was recorded with (0.7), so that a change of the default is not a change of the engine
    ("sampled_dropmatch", dict(gamma=4, max_new_tokens=40, temperature=0.8, seed=7),
     dict(rule="dropmatch", p=None, auto_agreement=0.7)),
]


def decisions(trace) -> dict:
    """Everything a run decided (tokens, reasons, path tokens, p), rounded where it is a float."""
    return {
        "p": trace.p,
        "output_ids": list(trace.output_ids),
        "rounds": [{
            "emitted": list(r.emitted), "extra_kind": r.extra_kind, "num_accepted": r.num_accepted,
            "head_rows": r.head_rows,
            "drafted": [[d.token, d.reason, list(d.path_tokens), d.majority_token, d.draft_votes,
                         None if d.js is None else round(d.js, 3)] for d in r.drafted],
        } for r in trace.rounds],
    }


def record_all(engine) -> dict:
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end

    ids = engine.encode(GOLDEN_PROMPT)
    return {name: decisions(run_to_end(engine.speculative(ids, DecodeConfig(**decode), RuleConfig(**rule))))
            for name, decode, rule in GOLDEN_RUNS}


if __name__ == "__main__":
    import os

    import torch

    os.environ.update(GOLDEN_ENV)

    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_embedded_pair

    GOLDEN_FILE.parent.mkdir(exist_ok=True)
    GOLDEN_FILE.write_text(json.dumps(record_all(Engine(load_embedded_pair(torch.device("cpu")))), indent=1) + "\n")
    print(f"wrote {GOLDEN_FILE}")
