"""Record the runs shipped in assets/recorded (the app opens them without loading a model).

    python scripts/record_runs.py [--out assets/recorded]

Embedded pair, the app's defaults (config.DEFAULTS: greedy, gamma = auto, hybrid drafts, DropMatch at p = auto), a GSM8K,
a chat and a code prompt from the app's examples.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dropmatch.assets import RECORDED_DIR, load_examples
from dropmatch.compare import compare_stream
from dropmatch.decoding.config import Settings
from dropmatch.decoding.engine import Engine
from dropmatch.models import load_embedded_pair
from dropmatch.runfile import record_of

RUNS = {"GSM8K_math": "math", "chat_writing": "writing", "code_completion": "code"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(RECORDED_DIR))
    args = parser.parse_args()
    examples = load_examples()
    engine = Engine(load_embedded_pair())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for index, (title, category) in enumerate(RUNS.items(), start=1):
        prompt = next(e["prompt"] for e in examples if e["category"] == category)
        decode, rule = Settings(prompt).parse()  # the one table of defaults (DEFAULTS)
        *_, state = compare_stream(engine, prompt, decode, rule)
        path = out / f"{index}_{title}.json"
        path.write_text(json.dumps(record_of(state, engine).to_dict()) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
