"""Make the built-in lessons (assets/lessons): one per rule of tools/lesson_runs.SPECS.

    python scripts/make_lessons.py [--only js,majority] [--tokens 64]
    python scripts/make_lessons.py --from-runs   # re-pick and re-write the lessons from the shipped runs

For each lesson, the embedded pair runs the app's example prompts (math, writing, code, instructions, in
that order), then the dev set (scripts/distill_draft.py: written prompts and GSM8K train questions; never an evaluation set),
under the lesson's settings (the app's defaults otherwise: gamma = auto, hybrid drafts,
p = auto) until the runs hold two slots of every reason its rule can give (one, past ENOUGH_RUNS runs) and every
close call the lesson asks;
then LESSON_SIZE slots are picked (tools/lesson_runs.pick_slots). Writes assets/lessons/<name>.json (the
lesson the page plays) and assets/lessons/runs/<name>.json (its runs, traces without states).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from dropmatch.assets import LESSONS_DIR, load_examples
from dropmatch.builtin_lessons import LESSON_FORMAT, LESSON_VERSION, lesson_path
from tools.lesson_runs import RUNS_FORMAT, SPECS, candidate_slots, lesson_of_runs, missing, read_runs, runs_path
from dropmatch.decoding.config import Settings
from dropmatch.decoding.engine import Engine, run_to_end
from dropmatch.models import load_embedded_pair
from dropmatch.runfile import mentioned_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tools.dev_set import DEV_GSM8K, DEV_PROMPTS, gsm8k_questions  # noqa: E402  (the dev set)


ENOUGH_RUNS = 8  # past this many runs, one slot of a rare reason is enough (two are looked for first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated lesson names (default: all)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per run")
    parser.add_argument("--from-runs", action="store_true", help="no model: the lessons from the shipped runs files")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(SPECS)
    if args.from_runs:
        for name in names:
            lesson = lesson_of_runs(SPECS[name], read_runs(runs_path(name)))
            lesson_path(name).write_text(json.dumps(lesson, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
            print(f"{name}: {len(lesson['slots'])} slots re-picked from {runs_path(name)}")
        return 0
    engine = Engine(load_embedded_pair())
    examples = load_examples()
    # the dev set as distill_draft.py devset makes it: written prompts and GSM8K train questions, interleaved
    dev = [prompt for pair in zip(DEV_PROMPTS, gsm8k_questions(0)[DEV_GSM8K]) for prompt in pair]
    (LESSONS_DIR / "runs").mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        spec = SPECS[name]
        runs, lacking = [], ["everything"]
        prompts = [e["prompt"] for e in sorted(examples, key=lambda e: _order(spec, e["category"]))] + dev
        for prompt in prompts:
            decode, rule = Settings(prompt, max_new_tokens=args.tokens, **spec.settings).parse()
            trace = run_to_end(engine.speculative(engine.encode(prompt), decode, rule))
            tokens = {t: engine.services.token_text(t) for t in sorted(mentioned_tokens(trace))}
            runs.append((prompt, trace, tokens))
            slots = candidate_slots(runs)
            lacking = missing(spec, trace.rule, slots, each=1)
            if not missing(spec, trace.rule, slots, each=2) or (not lacking and len(runs) >= ENOUGH_RUNS):
                break
        if lacking:
            failed += 1
            print(f"{name}: the example and dev prompts lack {', '.join(lacking)}", file=sys.stderr)
        lesson = lesson_of_runs(spec, runs)
        assert lesson["format"] == LESSON_FORMAT
        lesson_path(name).write_text(json.dumps(lesson, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        document = {"format": RUNS_FORMAT, "version": LESSON_VERSION, "lesson": name, "settings": spec.settings,
                    "max_new_tokens": args.tokens,
                    "runs": [{"prompt": prompt, "trace": trace.to_dict(), "tokens": {str(k): v for k, v in tokens.items()}}
                             for prompt, trace, tokens in runs]}
        runs_path(name).write_text(json.dumps(document, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
        counts = dict(Counter(s["answer"] for s in lesson["slots"]))
        tags = sorted({t for s in lesson["slots"] for t in s["tags"]})
        print(f"{name}: {len(runs)} runs, {len(lesson['slots'])} slots {counts}, close calls {tags}")
    return 1 if failed else 0


def _order(spec, category: str) -> int:
    return spec.runs_from.index(category) if category in spec.runs_from else len(spec.runs_from)


if __name__ == "__main__":
    raise SystemExit(main())
