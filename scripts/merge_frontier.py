"""One frontier document from two benchmark runs on the same prompts: the base run's points, with the
named rules' points taken from a newer run instead (each point keeps the date of its run).

    python scripts/merge_frontier.py assets/results/frontier.json assets/results/frontier_rivals.json \
        --take dropmatch,fly,margin --out assets/results/frontier.json

--drop names rules whose points leave the document altogether (a rule the project no longer has).

Every point's tau gain is against the lossless SD of its own run (greedy lossless SD emits the same tokens
in both runs on the same prompts, which the script checks), so points of the two runs share one origin.
Refuses documents whose prompts differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def merged(base: dict, newer: dict, take: tuple[str, ...], drop: tuple[str, ...] = ()) -> dict:
    """base with the points (and pooled rows) of the `take` rules replaced by newer's, and those of the
    `drop` rules removed."""
    if _prompts(base) != _prompts(newer):
        raise SystemExit("the two runs are not on the same prompts: their points cannot share one chart")
    if _lossless_texts(base) != _lossless_texts(newer):
        raise SystemExit("lossless SD emitted other tokens in the two runs: their gains have different origins")
    base_date, newer_date = base["settings"].get("date", "base"), newer["settings"].get("date", "newer")
    gone = set(take) | set(drop)
    keep = [dict(point, run=point.get("run", base_date)) for point in base["frontier"] if point["rule"] not in gone]
    added = [dict(point, run=newer_date) for point in newer["frontier"] if point["rule"] in take]
    rules = {label: stats for label, stats in base["rules"].items() if label.split("@")[0].split("/")[0] not in gone}
    rules.update({label: stats for label, stats in newer["rules"].items() if label.split("@")[0].split("/")[0] in take})
    out = dict(base, frontier=keep + added, rules=rules)
    earlier = base["settings"].get("merged_from") or [
        {"command": base["settings"].get("command"), "date": base_date, "rules": "all"}]
    # a base that is itself a merge keeps its runs, less the rules taken or dropped now (base stays as it was)
    earlier = [dict(run, rules=f"{run['rules']} (now without {', '.join(sorted(gone))})") for run in earlier]
    out["settings"] = dict(base["settings"], merged_from=[
        *earlier, {"command": newer["settings"].get("command"), "date": newer_date, "rules": ",".join(take)}])
    return out


def _prompts(document: dict) -> dict:
    return {name: [row["prompt"] for row in rows] for name, rows in document["prompts"].items()}


def _lossless_texts(document: dict) -> dict:
    return {name: [row["lossless"]["text"] for row in rows] for name, rows in document["prompts"].items()}


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("newer")
    parser.add_argument("--take", required=True, help="comma-separated rules whose points come from the newer run")
    parser.add_argument("--drop", default="", help="comma-separated rules whose points are removed")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    base, newer = (json.loads(Path(path).read_text()) for path in (args.base, args.newer))
    document = merged(base, newer, _names(args.take), _names(args.drop))
    Path(args.out).write_text(json.dumps(document, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {len(document['frontier'])} points", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
