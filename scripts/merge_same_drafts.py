"""One same-drafts document from benchmark runs over different prompt sets (run side by side, one per core):
each run's `same_drafts` (per draft policy and prompt set) and `same_drafts_info`, with every command kept.

    python scripts/merge_same_drafts.py runs/a.json runs/b.json --out assets/results/same_drafts.json

Refuses runs whose settings other than their prompts differ (their numbers would not be one comparison), and
a prompt set that two runs both measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SAME = ("max_new_tokens", "gamma", "draft_source", "p", "k", "temperature", "top_p", "seed", "same_drafts_gamma",
        "target", "draft", "eagle3_head")


def merged(documents: list[dict]) -> dict:
    """The documents' same-drafts results as one document (settings: the first's, with every command)."""
    first = documents[0]
    for other in documents[1:]:
        differ = [key for key in SAME if first["settings"].get(key) != other["settings"].get(key)]
        if differ:
            raise SystemExit(f"the runs differ in {', '.join(differ)}: not one comparison")
    same, sets = {}, {}
    for document in documents:
        for policy, by_set in document["same_drafts"].items():
            for name, rules in by_set.items():
                if name in same.setdefault(policy, {}):
                    raise SystemExit(f"{name} was measured by two runs")
                same[policy][name] = rules
        sets.update(document["same_drafts_info"].get("sets", {}))
    info = dict(first["same_drafts_info"], sets=sets)
    settings = dict(first["settings"], commands=[d["settings"].get("command") for d in documents],
                    machines=sorted({d["settings"].get("machine", "") for d in documents}))
    return {"settings": settings, "same_drafts": same, "same_drafts_info": info,
            "interrupted": any(d.get("interrupted") for d in documents)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="benchmark JSON documents with same_drafts")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    documents = [json.loads(Path(path).read_text()) for path in args.runs]
    if not all("same_drafts" in d for d in documents):
        print("error: every run must come from --same-drafts", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(merged(documents), indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
