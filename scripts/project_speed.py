"""The cost model on a benchmark run: DropMatch's speed against lossless SD's, measured, predicted
from lossless SD's unit costs and DropMatch's own acceptance and judge-step cost (dropmatch.cost_model),
and projected at cost shapes this machine does not have (labelled as projections).

    python scripts/project_speed.py assets/results/robustness.json [--markdown out.md]

Per benchmark, and pooled over every benchmark of the file (the component costs add up)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.cost_model import project  # noqa: E402


def summed(parts: list[dict]) -> dict:
    return {key: sum(part[key] for part in parts) for key in parts[0]}


def projections(document: dict) -> list[tuple[str, str, dict]]:
    """(benchmark or "pooled", run label, cost_model.project) for every lossy run with costs."""
    rows, by_label = [], {}
    for name, benchmark in document["benchmarks"].items():
        runs = benchmark.get("rules") or {}
        lossless = (runs.get("lossless") or {}).get("costs")
        if not lossless:
            continue
        for label, run in runs.items():
            if label != "lossless" and run.get("costs"):
                rows.append((name, label, project(lossless, run["costs"])))
                by_label.setdefault(label, ([], []))
                by_label[label][0].append(lossless)
                by_label[label][1].append(run["costs"])
    for label, (lossless, lossy) in by_label.items():
        rows.append(("pooled", label, project(summed(lossless), summed(lossy))))
    return rows


def markdown(rows: list[tuple[str, str, dict]]) -> str:
    names = list(rows[0][2]["projections"]) if rows else []
    lines = ["| benchmark | run | measured vs lossless | predicted | error | verify step per judged position | "
             + " | ".join(f"projection: {n}" for n in names) + " |", "|---" * (6 + len(names)) + "|"]
    for name, label, found in rows:
        error = found["predicted"] / found["measured"] - 1.0
        lines.append(f"| {name} | {label} | {found['measured']:.3f}x | {found['predicted']:.3f}x | {100 * error:+.1f}% | "
                     f"{1000 * found['judge_step_per_position_s']:.2f} ms | "
                     + " | ".join(f"{found['projections'][n]:.3f}x" for n in names) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a benchmark JSON (dropmatch-bench --json)")
    parser.add_argument("--markdown", default=None, help="write the table here too")
    args = parser.parse_args(argv)
    try:
        document = json.loads(Path(args.results).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        print(f"error: cannot read {args.results}: {type(error).__name__}", file=sys.stderr)
        return 2
    rows = projections(document)
    if not rows:
        print(f"error: {args.results} has no runs with component costs (benchmark runs since the cost model)",
              file=sys.stderr)
        return 2
    table = markdown(rows)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
