"""The trained judge's features and classifier (AutoJudge, arXiv 2504.20039): from mined records
(trained_judge.mining) to a judge file's contents. `scripts/mine_judge.py train` runs it on the embedded
pair and writes WORK/judge.json.

features  the target's final hidden state on reading the draft's token at the mismatch (AutoJudge's
          "DT" setup, the one its vLLM inference uses), recomputed from the token ids with a batch of one;
fit       split by question (seeded), standardised, scikit-learn's LogisticRegression over AutoJudge's
          grid of C, the best by validation ROC-AUC (the largest C within AUC_TIE of it: with little data
          the AUC is flat over the smallest C); the validation quantiles of the score as the threshold
          grid, the shipped threshold the largest whose validation recall of important mismatches is at
          least `recall`.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from dropmatch.decoding.trained_judge import JUDGE_FORMAT, JUDGE_VERSION

AUC_TIE = 0.005


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


def fit_judge(records: list[dict], target, seed: int = 0, val_share: float = 0.2, recall: float = 0.9) -> dict:
    """A judge file's contents (trained_judge.TrainedJudge.from_dict reads it) from mined records (the finished
    ones with mismatches are used) on `target` (CausalLM), split by question with `seed`."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import StandardScaler

    records = [r for r in records if r["finished"] and r["mismatches"]]
    start = time.perf_counter()
    per_question = [features_of(target, record) for record in records]
    labels = [np.array([m[3] for m in record["mismatches"]]) for record in records]
    feature_seconds = time.perf_counter() - start
    order = np.random.default_rng(seed).permutation(len(records))
    cut = int(round(len(records) * (1.0 - val_share)))
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
    chosen = max((row for row in table if row["recall_important"] >= recall), key=lambda row: row["threshold"])
    judge = {
        "format": JUDGE_FORMAT, "version": JUDGE_VERSION, "target": target.name, "hidden_size": target.hidden_size,
        "features": "target final hidden state on reading the drafted token",
        "mean": scaler.mean_.tolist(), "scale": scaler.scale_.tolist(),
        "weight": model.coef_[0].tolist(), "bias": float(model.intercept_[0]),
        "threshold": chosen["threshold"], "thresholds": thresholds,
        "validation": {"roc_auc": float(auc), "C": c, "tried": tried, "table": table, "recall_goal": recall,
                       "questions": len(val_ids), "mismatches": int(len(y_val)), "important": int(y_val.sum()),
                       "share": val_share},
        "training": {"questions": len(train_ids), "mismatches": int(len(y_train)), "important": int(y_train.sum()),
                     "feature_seconds": round(feature_seconds, 1), "seed": seed},
    }
    return judge


def threshold_table(thresholds: list[float], scores: np.ndarray, important: np.ndarray) -> list[dict]:
    """Per threshold: the share of mismatches the judge accepts (score < threshold) and the share of
    important ones it still rejects (their recall)."""
    rows = []
    for threshold in thresholds:
        accepted = scores < threshold
        recall = float((~accepted[important == 1]).mean()) if important.any() else 1.0
        rows.append({"threshold": threshold, "accepted": float(accepted.mean()), "recall_important": recall})
    return rows
