"""Judge a shipped greedy benchmark document's runs against today's reference band, from its stored figures.

    python scripts/reband_robustness.py assets/results/robustness.json

The band's repetition axis under greedy reads the target's own greedy text (lossless SD's, prompt by prompt:
summary.own_greedy_distinct2) instead of its sampled text, which put lossless SD itself outside the band. The
figures a band reads (NLL, off-nucleus rate, distinct-2 per prompt) are stored in the document, so the band is
recomputed with the benchmark's own functions (summary.band_checks, within_reference, task_score_note); no run
is repeated and no figure changes. The document says so in settings["rebanded"].
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dropmatch.decoding.acceptance import BASELINE
from dropmatch.bench import tables
from dropmatch.bench.summary import band_checks, task_score_note, within_reference


def own_greedy_distinct2(rows: list[dict], label: str) -> float | None:
    """The mean distinct-2 of lossless SD's text over the prompts where `label` ran (rows: the document's
    per-prompt rows of one benchmark)."""
    values = [row[BASELINE]["distinct2"] for row in rows
              if isinstance(row.get(label), dict) and isinstance(row.get(BASELINE), dict)]
    return sum(values) / len(values) if values else None


def rebanded(document: dict, without_length: bool = False) -> dict:
    """The document with every run's band and within_reference judged by today's yardstick (greedy only).
    without_length: drop the length axis of a run made before lossless SD's answer counted among the target's own
    (its length_outside read one sample alone, which put lossless SD itself outside; the answers' lengths are not
    stored, so it cannot be re-judged: the rules' ended-early shares stay)."""
    if float(document["settings"].get("temperature") or 0.0) != 0.0:
        raise SystemExit("a sampled run's band already reads the target's samples: nothing to re-judge")
    for name, benchmark in document["benchmarks"].items():
        reference = (benchmark.get("reference") or {}).get("target_sampled")
        rows = document["prompts"][name]
        benchmark["task_score_note"] = task_score_note(benchmark["rules"], benchmark.get("autoregressive") or {})
        if reference is None:
            continue
        reference["repetition_against"] = tables.GREEDY_YARDSTICK
        for label, stats in benchmark["rules"].items():
            if without_length:
                stats.pop("length_outside", None)
            yardstick = own_greedy_distinct2(rows, label)
            stats["repetition_yardstick"] = yardstick
            stats["band"] = band_checks(stats, reference, yardstick)
            stats["within_reference"] = within_reference(stats, reference, yardstick)
    document["settings"]["rebanded"] = (f"{time.strftime('%Y-%m-%d')}: bands re-judged from the stored figures by "
                                        "scripts/reband_robustness.py (greedy repetition against lossless SD's text"
                                        + ("; the length axis left out, its counts predating lossless SD's answer "
                                           "as one of the target's own)" if without_length else ")"))
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("document")
    parser.add_argument("--without-length", action="store_true",
                        help="drop the length axis (a run whose length counts read the target's samples alone)")
    args = parser.parse_args(argv)
    path = Path(args.document)
    path.write_text(json.dumps(rebanded(json.loads(path.read_text()), args.without_length), indent=1) + "\n")
    print(f"re-judged {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
