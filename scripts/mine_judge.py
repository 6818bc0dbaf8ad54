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

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dropmatch import quality  # noqa: E402
from dropmatch.trained_judge.mining import Walk  # noqa: E402
from dropmatch.models import encode_prompt, load_embedded_pair, stop_token_ids  # noqa: E402
from dropmatch.models.continuations import Job, crop_rows, greedy_continuations, prefix_rows  # noqa: E402

DEFAULT_WORK = ROOT / "runs" / "judge"
DEFAULT_GSM8K_TRAIN = ROOT.parent / "shared" / "benchmarks" / "gsm8k_train.jsonl"
JUDGE_DIR = ROOT / "assets" / "judge"
AUC_TIE = 0.005


def read_questions(path: Path) -> list[str]:
    return [json.loads(line)["question"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class Miner:
    """The walks in flight, their cached prefixes, and the batched continuations that advance them."""

    def __init__(self, pair, max_new_tokens: int, batch: int):
        self.pair, self.max_new_tokens, self.batch = pair, max_new_tokens, batch
        self.stops = frozenset(stop_token_ids(pair.tokenizer, pair.target.model))
        self.rows: dict[int, object] = {}  # walk index -> rows of prompt + response[:-1]
        self.continuation_tokens = 0

    def answer_of(self, response: list[int]):
        return quality.gsm8k_prediction(self.pair.tokenizer.decode(response, skip_special_tokens=True))

    def start(self, questions: list[tuple[int, str]]) -> list[Walk]:
        """The walks of some questions: their greedy answers, decoded together."""
        prompts = [encode_prompt(self.pair.tokenizer, question) for _, question in questions]
        jobs = [Job(prefix_rows(self.pair.target, ids[:-1]), ids[-1], self.max_new_tokens) for ids in prompts]
        walks, unfinished = [], []
        for (index, _), ids, answer in zip(questions, prompts, self._continue(jobs)):
            if not answer.tokens or answer.tokens[-1] not in self.stops:
                unfinished.append({"index": index, "prompt_ids": ids, "response": answer.tokens, "answer": None,
                                   "finished": False, "mismatches": [], "control": []})
                continue  # no final answer within the budget: nothing to compare a continuation's with
            walk = Walk(index, ids, answer.tokens, self.answer_of, self.max_new_tokens)
            self.rows[index] = answer.rows
            walks.append(walk)
        return walks, unfinished

    def draft_tokens(self, walk: Walk) -> list[int]:
        """The draft's greedy token at each answer position, the answer read so far as its prefix."""
        draft = self.pair.draft
        ids = torch.tensor(walk.prompt_ids + walk.response[:-1], dtype=torch.long, device=draft.device)
        hidden = draft.hidden(ids, draft.new_cache())[len(walk.prompt_ids) - 1:]
        return draft.logits(hidden).argmax(-1).tolist()

    def step(self, walks: list[Walk]) -> None:
        """One continuation for every walk that asks for one, decoded together."""
        for walk in walks:
            if walk.wants_draft:
                walk.set_draft_tokens(self.draft_tokens(walk))
        asks = [(walk, walk.job()) for walk in walks]
        asks = [(walk, job) for walk, job in asks if job is not None]
        if not asks:
            return
        jobs = [Job(crop_rows(self.rows[walk.index], len(walk.prompt_ids) + position), token, budget)
                for walk, (position, token, budget) in asks]
        for (walk, _), result in zip(asks, self._continue(jobs)):
            if walk.settle(result.tokens):
                self.rows[walk.index] = result.rows

    def _continue(self, jobs: list[Job]):
        results = greedy_continuations(self.pair.target, jobs, self.stops)
        self.continuation_tokens += sum(len(result.tokens) for result in results)
        return results


def finished_indices(path: Path) -> set[int]:
    return {record["index"] for record in read_mined(path)} if path.exists() else set()


def walk_record(walk: Walk) -> dict:
    return {
        "index": walk.index, "prompt_ids": walk.prompt_ids, "response": walk.response,
        "answer": walk.answer, "finished": True, "mismatches": [[m.position, m.target_token, m.draft_token, int(m.important)]
                                              for m in walk.labelled()],
        "control": [[m.position, m.target_token, m.draft_token, int(m.important)]
                    for m in walk.mismatches if m.control],
    }


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


def read_mined(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@torch.inference_mode()
def features_of(target, record: dict) -> np.ndarray:
    """[m, H] the target's final hidden state on reading the draft's token at each mismatch of a mined
    question (the answer's prefix before it as the walk left it: the final response's prefix)."""
    prompt, response = record["prompt_ids"], record["response"]
    cache = target.new_cache()
    ids = torch.tensor(prompt + response, dtype=torch.long, device=target.device)
    hidden = target.hidden(ids, cache)
    rows = {}
    # The mismatch at t was read with the draft's token at t; a kept one is in the response already.
    for position, _, draft_token, important in sorted(record["mismatches"], key=lambda m: -m[0]):
        if response[position] == draft_token:
            rows[position] = hidden[len(prompt) + position]
        else:
            target.crop(cache, len(prompt) + position)
            rows[position] = target.hidden(torch.tensor([draft_token], device=target.device), cache)[-1]
    return np.stack([rows[m[0]].float().cpu().numpy() for m in record["mismatches"]])


def train(args, pair=None) -> None:
    """Features of WORK/mined.jsonl's mismatches, the classifier, WORK/judge.json (pair: the embedded one
    unless given, for the tests' tiny pair)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import StandardScaler

    work = Path(args.work)
    records = [r for r in read_mined(work / "mined.jsonl") if r["finished"] and r["mismatches"]]
    torch.set_num_threads(args.threads)
    pair = pair or load_embedded_pair()
    start = time.perf_counter()
    per_question = [features_of(pair.target, record) for record in records]
    labels = [np.array([m[3] for m in record["mismatches"]]) for record in records]
    feature_seconds = time.perf_counter() - start
    order = np.random.default_rng(args.seed).permutation(len(records))
    cut = int(round(len(records) * (1.0 - args.val_share)))
    train_ids, val_ids = order[:cut], order[cut:]
    x_train, y_train = np.concatenate([per_question[i] for i in train_ids]), np.concatenate([labels[i] for i in train_ids])
    x_val, y_val = np.concatenate([per_question[i] for i in val_ids]), np.concatenate([labels[i] for i in val_ids])
    scaler = StandardScaler().fit(x_train)
    grid = list((10 ** 0.5) ** -np.arange(1, 15)[::-1]) + [1, 3, 10, 50, 100]  # AutoJudge's C grid
    tried, models = [], {}
    for c in grid:
        models[float(c)] = LogisticRegression(C=float(c), max_iter=2000).fit(scaler.transform(x_train), y_train)
        auc = roc_auc_score(y_val, models[float(c)].predict_proba(scaler.transform(x_val))[:, 1])
        tried.append({"C": float(c), "val_roc_auc": float(auc)})
    # The best validation ROC-AUC; among C within AUC_TIE of it, the largest (the least regularised): with
    # little data the AUC is flat over the smallest C, whose scores all sit at the base rate.
    top = max(row["val_roc_auc"] for row in tried)
    c = max(row["C"] for row in tried if row["val_roc_auc"] >= top - AUC_TIE)
    auc, model = next(row["val_roc_auc"] for row in tried if row["C"] == c), models[c]
    val_scores = model.predict_proba(scaler.transform(x_val))[:, 1]
    thresholds = [float(np.quantile(val_scores, q)) for q in np.linspace(0, 1, 26)]
    table = threshold_table(thresholds, val_scores, y_val)
    chosen = max((row for row in table if row["recall_important"] >= args.recall), key=lambda row: row["threshold"])
    judge = {
        "format": "dropmatch-judge", "version": 1, "target": pair.target.name, "hidden_size": pair.target.hidden_size,
        "features": "target final hidden state on reading the drafted token",
        "mean": scaler.mean_.tolist(), "scale": scaler.scale_.tolist(),
        "weight": model.coef_[0].tolist(), "bias": float(model.intercept_[0]),
        "threshold": chosen["threshold"], "thresholds": thresholds,
        "validation": {"roc_auc": float(auc), "C": c, "tried": tried, "table": table, "recall_goal": args.recall,
                       "questions": len(val_ids), "mismatches": int(len(y_val)), "important": int(y_val.sum()),
                       "share": args.val_share},
        "training": {"questions": len(train_ids), "mismatches": int(len(y_train)), "important": int(y_train.sum()),
                     "feature_seconds": round(feature_seconds, 1), "seed": args.seed},
    }
    (work / "judge.json").write_text(json.dumps(judge, indent=1) + "\n", encoding="utf-8")
    print(f"C {c:g}: validation ROC-AUC {auc:.3f}; threshold {chosen['threshold']:.3f} accepts "
          f"{chosen['accepted']:.0%} of validation mismatches at recall {chosen['recall_important']:.2f}")


def threshold_table(thresholds: list[float], scores: np.ndarray, important: np.ndarray) -> list[dict]:
    """Per threshold: the share of mismatches the judge accepts (score < threshold) and the share of
    important ones it still rejects (their recall)."""
    rows = []
    for threshold in thresholds:
        accepted = scores < threshold
        recall = float((~accepted[important == 1]).mean()) if important.any() else 1.0
        rows.append({"threshold": threshold, "accepted": float(accepted.mean()), "recall_important": recall})
    return rows


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
