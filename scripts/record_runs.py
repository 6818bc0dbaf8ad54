"""Record the runs shipped in assets/recorded (the app opens them without loading a model).

    python scripts/record_runs.py [--out assets/recorded]

Embedded pair, the app's defaults (greedy, gamma = auto, hybrid drafts, DropMatch at p = auto, 96 new tokens), a GSM8K,
a chat and a code prompt from the app's examples.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import app
from dropmatch.compare import compare_stream
from dropmatch.config import DecodeConfig, RuleConfig
from dropmatch.engine import Engine
from dropmatch.models import load_embedded_pair

RUNS = {"GSM8K_math": "math", "chat_writing": "writing", "code_completion": "code"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(app.RECORDED_DIR))
    args = parser.parse_args()
    examples = json.loads(app.EXAMPLES_FILE.read_text())
    engine = Engine(load_embedded_pair())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for index, (title, category) in enumerate(RUNS.items(), start=1):
        prompt = next(e["prompt"] for e in examples if e["category"] == category)
        decode = DecodeConfig(**DecodeConfig.parse_gamma(app.DEFAULTS["gamma"]), draft_source=app.DEFAULTS["draft_source"],
                              max_new_tokens=app.DEFAULTS["max_new_tokens"])
        *_, state = compare_stream(engine, prompt, decode, RuleConfig(app.DEFAULTS["rule"], p=None))
        path = out / f"{index}_{title}.json"
        path.write_text(json.dumps(app.record_of(state, engine).to_dict()) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
