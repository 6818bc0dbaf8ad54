"""Recipe of the shipped trained judge (assets/judge): AutoJudge's mining, features and classifier
(arXiv 2504.20039; its code garipovroma/autojudge read for the method, this written for the project).

    python scripts/mine_judge.py mine --prompts 160       # GSM8K *train* questions -> WORK/mined.jsonl
    python scripts/mine_judge.py train                    # features, logistic regression -> WORK/judge.json
    python scripts/mine_judge.py export                   # -> assets/judge/{judge.json,mined.json,recipe.json}

mine      for each question (file order from --start), the embedded target's greedy answer; at each
          position where the shipped draft's greedy token differs, the draft's token put in and the
          target continued greedily to the end: *important* iff the extracted final answer (GSM8K's
          number, quality.gsm8k_prediction) changes; where it does not, the draft's token is kept and
          the walk goes on along the new answer (dropmatch.mining.Walk). Continuations of --batch
          walks run together (models.continuations). One control job per question puts the
          target's own token back: how often its answer "changes" is the batched decode's own noise.
          Appends a line per finished question to WORK/mined.jsonl; a later run skips those.
train     features: the target's final hidden state on reading the draft's token at the mismatch
          (AutoJudge's "DT" setup, the one its vLLM inference uses), recomputed from the token ids
          with a batch of one; split by question (80/20, seeded: little data); standardised; scikit-learn's
          LogisticRegression over AutoJudge's grid of C, the best by validation ROC-AUC (the largest C
          within 0.005 of it: with little data the AUC is flat over the smallest C); the
          validation quantiles of the score as the threshold grid, and the shipped threshold the
          largest whose validation recall of important mismatches is at least --recall.
export    the judge file, the mined set (token ids and labels) and this recipe into assets/judge.
Never trained on: the GSM8K test set, HumanEval, MT-Bench or IFEval.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dropmatch.models import load_embedded_pair  # noqa: E402
from tools.mining import Miner, read_mined, walk_record  # noqa: E402
from tools.training import fit_judge  # noqa: E402

DEFAULT_WORK = ROOT / "runs" / "judge"
DEFAULT_GSM8K_TRAIN = ROOT.parent / "shared" / "benchmarks" / "gsm8k_train.jsonl"
JUDGE_DIR = ROOT / "assets" / "judge"


def read_questions(path: Path) -> list[str]:
    return [json.loads(line)["question"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def finished_indices(path: Path) -> set[int]:
    return {record["index"] for record in read_mined(path)} if path.exists() else set()


def mine(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = work / "mined.jsonl"
    torch.set_num_threads(args.threads)
    pair = load_embedded_pair()
    miner = Miner(pair, args.max_new_tokens, args.batch)
    done = finished_indices(out)
    questions = read_questions(Path(args.gsm8k_train))
    queue = [(index, questions[index]) for index in range(args.start, min(args.start + args.prompts, len(questions)))
             if index not in done]
    print(f"{len(done)} questions mined before; {len(queue)} to go, batches of {args.batch}", flush=True)
    start, active, finished = time.perf_counter(), [], 0
    while queue or active:
        room = args.batch - len(active)
        if room > 0 and queue:
            started, unfinished = miner.start(queue[:room])
            active += started
            queue = queue[room:]
            with out.open("a", encoding="utf-8") as file:
                file.writelines(json.dumps(record) + "\n" for record in unfinished)
        miner.step(active)
        still = []
        for walk in active:
            if walk.over:
                with out.open("a", encoding="utf-8") as file:
                    file.write(json.dumps(walk_record(walk)) + "\n")
                del miner.rows[walk.index]
                finished += 1
            else:
                still.append(walk)
        active = still
        minutes = (time.perf_counter() - start) / 60
        print(f"{finished} finished, {len(active)} walking, {miner.continuation_tokens} continuation tokens, "
              f"{minutes:.1f} min", flush=True)
        note_session(work, args, finished, miner.continuation_tokens, minutes)


def note_session(work: Path, args, finished: int, tokens: int, minutes: float) -> None:
    """WORK/mining.json: per mining session (this run's entry rewritten as it goes), what it did and how long."""
    path = work / "mining.json"
    sessions = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
    entry = {"pid": os.getpid(), "start": args.start, "prompts": args.prompts, "batch": args.batch,
             "max_new_tokens": args.max_new_tokens, "finished_walks": finished, "continuation_tokens": tokens,
             "minutes": round(minutes, 1)}
    sessions = [s for s in sessions if s.get("pid") != entry["pid"]] + [entry]
    path.write_text(json.dumps(sessions, indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- features and the classifier


def train(args) -> None:
    """Features of WORK/mined.jsonl's mismatches and the classifier (trained_judge.training) -> WORK/judge.json."""
    work = Path(args.work)
    torch.set_num_threads(args.threads)
    judge = fit_judge(read_mined(work / "mined.jsonl"), load_embedded_pair().target, args.seed, args.val_share, args.recall)
    (work / "judge.json").write_text(json.dumps(judge, indent=1) + "\n", encoding="utf-8")
    chosen = next(row for row in judge["validation"]["table"] if row["threshold"] == judge["threshold"])
    print(f"C {judge['validation']['C']:g}: validation ROC-AUC {judge['validation']['roc_auc']:.3f}; threshold "
          f"{chosen['threshold']:.3f} accepts {chosen['accepted']:.0%} of validation mismatches at recall "
          f"{chosen['recall_important']:.2f}")


def export(args) -> None:
    work = Path(args.work)
    JUDGE_DIR.mkdir(parents=True, exist_ok=True)
    judge = json.loads((work / "judge.json").read_text(encoding="utf-8"))
    records = read_mined(work / "mined.jsonl")
    (JUDGE_DIR / "judge.json").write_text(json.dumps(judge) + "\n", encoding="utf-8")
    mined = [{key: record[key] for key in ("index", "finished", "prompt_ids", "response", "mismatches", "control")}
             for record in records]
    (JUDGE_DIR / "mined.json").write_text(json.dumps(mined) + "\n", encoding="utf-8")
    (JUDGE_DIR / "recipe.json").write_text(json.dumps(recipe(work, records, judge), indent=1) + "\n", encoding="utf-8")
    print(f"exported the judge and {len(mined)} mined questions to {JUDGE_DIR}")


def recipe(work: Path, records: list[dict], judge: dict) -> dict:
    """What the shipped judge was made from and how: the mined set's counts, the mining sessions (as
    WORK/mining.json recorded them), the training and validation figures, the commands."""
    finished = [r for r in records if r["finished"]]
    mismatches = [m for r in finished for m in r["mismatches"]]
    controls = [m for r in finished for m in r["control"]]
    sessions = json.loads((work / "mining.json").read_text(encoding="utf-8")) if (work / "mining.json").exists() else []
    return {
        "commands": ["python scripts/mine_judge.py mine --prompts 160 --batch 24 --max-new-tokens 192",
                     "python scripts/mine_judge.py train", "python scripts/mine_judge.py export"],
        "source": "GSM8K train (../shared/benchmarks/gsm8k_train.jsonl), the lines in 'index' of mined.json",
        "questions": len(records), "with_a_final_answer": len(finished),
        "mismatches": len(mismatches), "important": sum(m[3] for m in mismatches),
        "control_jobs": len(controls), "control_answer_changed": sum(m[3] for m in controls),
        "mining_sessions": sessions,
        "features": judge["features"], "training": judge["training"],
        "validation": {key: judge["validation"][key] for key in ("roc_auc", "C", "questions", "mismatches", "important",
                                                                 "recall_goal")},
        "threshold": judge["threshold"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("mine", "train", "export"))
    parser.add_argument("--work", default=str(DEFAULT_WORK))
    parser.add_argument("--gsm8k-train", default=str(DEFAULT_GSM8K_TRAIN))
    parser.add_argument("--start", type=int, default=0, help="first GSM8K train line mined")
    parser.add_argument("--prompts", type=int, default=160, help="questions mined from --start")
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--batch", type=int, default=16, help="walks whose continuations decode together")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the train/validation split")
    parser.add_argument("--val-share", type=float, default=0.2, help="questions held out for validation")
    parser.add_argument("--recall", type=float, default=0.9,
                        help="the shipped threshold keeps at least this validation recall of important mismatches")
    args = parser.parse_args(argv)
    {"mine": mine, "train": train, "export": export}[args.command](args)


if __name__ == "__main__":
    main()
