"""Does the reduced path support (RuleConfig.path_support) decide as the full vocabulary does?

    python scripts/support_agreement.py --prompts runs/distill/dev.jsonl --limit 16 --support 64,512 [--recorded]

For each prompt: a comparison at the shipped defaults on the embedded pair (the lossless column keeps
its states), then the rule lab re-judges the lossless column's drafts with every path rule twice, on
the full vocabulary and on the reduced support, at the lossy run's own K, p and centroid. With
--recorded the shipped recorded runs are re-judged too. Prints the share of drafted tokens whose
decision agrees (all of them, and those where the full computation read paths), the
disagreements, and the lab's time for both.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from dropmatch import acceptance, lab
from dropmatch.compare import compare_stream
from dropmatch.config import Settings
from dropmatch.engine import Engine
from dropmatch.models import load_embedded_pair
from dropmatch.record import read_recorded_run, recorded_runs

PATH_RULES = tuple(name for name, rule in acceptance.RULES.items() if rule.uses_paths)


def traces(engine: Engine, prompts: list[str], recorded: bool) -> list[tuple[str, object, object]]:
    """(name, lossless trace with states, lossy trace) per prompt, then per shipped recorded run."""
    found = []
    for number, prompt in enumerate(prompts):
        decode, rule = Settings(prompt, max_new_tokens=128).parse()
        *_, state = compare_stream(engine, prompt, decode, rule, run_ar=False)
        found.append((f"prompt {number}", state.lossless.trace, state.lossy.trace))
    if recorded:
        for title, path in recorded_runs().items():
            record = read_recorded_run(path)
            found.append((title, record.lossless, record.lossy))
    return found


def compare(engine: Engine, name: str, lossless, lossy, support: int) -> dict:
    """Agreement of every path rule's decisions, full vocabulary against the support, on one run."""
    prepared = lab.prepare(lossless, engine.target, engine.draft)
    settings = lab.lab_settings(lossy)
    settings = dataclasses.replace(settings, p=settings.p if settings.p is not None else 0.1)
    matrices, seconds = {}, {}
    for size in (0, support):
        start = time.perf_counter()
        matrices[size] = lab.rejudge(prepared, engine.target, dataclasses.replace(settings, path_support=size),
                                     engine.token_text, rules=PATH_RULES)
        seconds[size] = time.perf_counter() - start
    total = agree = read = read_agree = 0
    disagreements = []
    for exact_row, reduced_row in zip(matrices[0]["rows"], matrices[support]["rows"]):
        for rule, full, reduced in zip(PATH_RULES, exact_row["cells"], reduced_row["cells"]):
            same = full["reason"] == reduced["reason"]
            total, agree = total + 1, agree + same
            if full["reason"] not in ("exact", "unchecked") and "paths:" in full["info"]:
                read, read_agree = read + 1, read_agree + same
            if not same:
                disagreements.append(f"{name} round {exact_row['round']} slot {exact_row['slot']} "
                                     f"{exact_row['text']!r} {rule}: {full['reason']} -> {reduced['reason']}")
    return {"total": total, "agree": agree, "read": read, "read_agree": read_agree,
            "disagreements": disagreements, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default="runs/distill/dev.jsonl")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--support", default="64", help="one or more sizes, comma-separated")
    parser.add_argument("--recorded", action="store_true", help="also the shipped recorded runs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    prompts = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    engine = Engine(load_embedded_pair())
    runs = traces(engine, prompts[: args.limit], args.recorded)
    report = {}
    for support in (int(size) for size in args.support.split(",")):
        results = [compare(engine, name, lossless, lossy, support) for name, lossless, lossy in runs]
        report[support] = summary(support, results)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def summary(support: int, results: list[dict]) -> dict:
    total = {key: sum(r[key] for r in results) for key in ("total", "agree", "read", "read_agree")}
    full_s = sum(r["seconds"][0] for r in results)
    reduced_s = sum(r["seconds"][support] for r in results)
    print(f"support {support}: {total['agree']}/{total['total']} decisions agree "
          f"({100 * total['agree'] / max(total['total'], 1):.2f}%), {total['read_agree']}/{total['read']} where the "
          f"full computation read paths ({100 * total['read_agree'] / max(total['read'], 1):.2f}%); "
          f"lab time full {full_s:.2f} s, reduced {reduced_s:.2f} s", flush=True)
    disagreements = [d for r in results for d in r["disagreements"]]
    for line in disagreements[:20]:
        print("  ", line)
    return {**total, "full_s": full_s, "reduced_s": reduced_s, "disagreements": disagreements}


if __name__ == "__main__":
    raise SystemExit(main())
