"""Recipe of a draft that reads the target's hidden states (EAGLE-style; dropmatch.models.FeatureNet).

Starts from the target's own answers made by `distill_draft.py generate` (WORK/generated.npz), then

  features  the target's final hidden state at every position of a sample of those answers
            (prompt included; bf16 on a CPU, where it is twice as fast as fp32) -> WORK/features.npz;
            a larger --feature-tokens later extends the file (bf16 rounding depends on how answers
            are batched, so an extended file equals a one-shot one up to that rounding);
  train     the FeatureNet on them: at position t it reads the token x_t and the feature f_{t-1}
            and must give the target's next-token distribution softmax(W f_t) over the draft's head
            rows (cross-entropy), and estimate f_t itself (smooth L1, weight --reg). With --unroll 1
            it is also trained on its own estimates: a second pass feeds g_{t-1} instead of f_{t-1},
            as happens from the second drafted token on. Best held-out checkpoint -> WORK/feature_best.pt;
  export    as distill_draft.py export (`--checkpoint feature_best.pt`).

Nothing is generated here, so no evaluation set is ever read (see distill_draft.py for the data).
The held-out answers are the first 256 of the same seeded shuffle that `distill_draft.py train`
holds out, so the shipped token-only draft never trained on them either.

Measured on the project's 2-core CPU (2026-11-30), on the shipped draft's 15,360 answers; NOT shipped
(README, "Shipped draft", has the variants tried):
    python scripts/feature_draft.py features --work runs/eagle     # 4,037 answers, 1.2M positions, ~26 min
    python scripts/feature_draft.py train --work runs/eagle --bf16  # 391 steps (defaults: from assets/draft, 18 min)
held-out greedy agreement 60.9% -> 62.3% (depth 1) / 61.9% (depth 2), training batches 77%. On the dev
set (24 prompts, gamma 4): tau 1.91 -> 1.93, draft step 5.6 -> 6.5 ms, 1.16x -> 1.15x autoregressive.
Extended to 8,117 answers (`features --feature-tokens 2400000`, 1,160 s more) and trained the same way
(393 steps): 62.1% / 61.7%, so here the steps, not the data, are the limit. 85 minutes on those
(`train --work runs/eagle --bf16 --minutes 85`, 1,956 steps): 66.1% / 65.2%; dev set tau 1.91 -> 1.99 but
1.35x -> 1.26x autoregressive (both drafts in bf16), so still not shipped. `--device cuda` runs both
steps on a GPU (not run yet). `train --init-from` a feature draft trains it further.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import distill_draft  # noqa: E402
from dropmatch.models import (  # noqa: E402
    EMBEDDED_DRAFT_DIR, FEATURE_KIND, FeatureNet, build_feature_net, draft_lm, load_draft_weights, load_embedded_target, stop_token_ids,
)

FEATURE_BATCH_TOKENS = 4096  # padded tokens per target forward when extracting features


# ---------------------------------------------------------------- features


def sample_answers(records: list[dict], token_budget: int, max_len: int, seed: int) -> list[dict]:
    """Answers in distill_draft's seeded shuffled order, cut at max_len tokens, until token_budget
    tokens (prompts included)."""
    chosen, total = [], 0
    for record in distill_draft.shuffled_answers(records, random.Random(seed)):
        if total >= token_budget:
            break
        chosen.append({**record, "ids": record["ids"][:max_len]})
        total += len(chosen[-1]["ids"])
    return chosen


def token_batches(records: list[dict], tokens: int) -> list[list[dict]]:
    """Records of similar length grouped so that a padded batch holds at most `tokens` positions."""
    batches, current = [], []
    for record in sorted(records, key=lambda r: r["length"]):
        if current and (len(current) + 1) * record["length"] > tokens:
            batches.append(current)
            current = []
        current.append(record)
    return batches + [current] if current else batches


@torch.inference_mode()
def target_features(decoder, records: list[dict], device: torch.device) -> list[np.ndarray]:
    """fp16 [len, H] per record: the target's final hidden states, in batches of similar length."""
    features: list[np.ndarray | None] = [None] * len(records)
    bar = tqdm(total=sum(len(r["ids"]) for r in records), desc="target features", unit="tok", mininterval=10)
    lengths = [{"index": i, "length": len(r["ids"])} for i, r in enumerate(records)]
    for batch in token_batches(lengths, FEATURE_BATCH_TOKENS):
        group = [item["index"] for item in batch]
        width = max(len(records[g]["ids"]) for g in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for b, g in enumerate(group):
            n = len(records[g]["ids"])
            ids[b, :n], attention[b, :n] = records[g]["ids"].long(), 1
        hidden = decoder(input_ids=ids.to(device), attention_mask=attention.to(device)).last_hidden_state
        hidden = hidden.to(torch.float16).cpu()
        for b, g in enumerate(group):
            features[g] = hidden[b, : len(records[g]["ids"])].numpy()
        bar.update(sum(len(records[g]["ids"]) for g in group))
    bar.close()
    return features


def features(args) -> None:
    """Extends WORK/features.npz when it exists: the sample's order is fixed by the seed, so the
    answers already there are its first ones, and only the rest of a larger --feature-tokens is run."""
    records, _ = distill_draft.load_generated(Path(args.work) / "generated.npz")
    chosen = sample_answers(records, args.feature_tokens, args.max_len, args.seed)
    out = Path(args.work) / "features.npz"
    stored = dict(np.load(out)) if out.exists() else None
    done = len(stored["lengths"]) if stored else 0
    if stored and not np.array_equal(stored["ids"], np.concatenate([r["ids"].numpy() for r in chosen[:done]])):
        raise SystemExit(f"error: {out} was made from other answers or another seed; move it away first")
    dtype = torch.bfloat16 if args.feature_dtype == "bfloat16" else torch.float32
    device = torch.device(args.device)
    model, _ = load_embedded_target(device, dtype)
    started = time.time()
    new = chosen[done:]
    rows = target_features(model.get_decoder(), new, device) if new else []
    parts = {"feats": list(rows), "ids": [r["ids"].numpy() for r in new],
             "lengths": [np.array([len(r["ids"]) for r in new], dtype=np.int64)],
             "prompt_lens": [np.array([r["prompt_len"] for r in new], dtype=np.int64)],
             "sources": [np.array([r["source"] for r in new])]}
    if stored:
        parts = {name: [stored[name], *arrays] for name, arrays in parts.items()}
    np.savez(out, **{name: np.concatenate(arrays) for name, arrays in parts.items()})
    print(f"wrote {out}: {len(chosen)} answers ({len(new)} new), {sum(len(r['ids']) for r in chosen)} positions; "
          f"{time.time() - started:.0f} s")


# ---------------------------------------------------------------- training


def load_features(path: Path) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """(features [N, H] fp16, ids [N], records {start, length, prompt_len}) of a features.npz."""
    data = np.load(path)
    ends = np.cumsum(data["lengths"])
    records = [{"start": int(end - n), "length": int(n), "prompt_len": int(pl)}
               for end, n, pl in zip(ends, data["lengths"], data["prompt_lens"])]
    return torch.from_numpy(data["feats"]), torch.from_numpy(data["ids"].astype(np.int64)), records


def padded(group: list[dict], all_features: torch.Tensor, all_ids: torch.Tensor, device: torch.device):
    """ids [B, T], features [B, T, H] fp32, attention [B, T], answer [B, T] (positions whose next
    token is an answer token), next_ids [B, T]."""
    width, hidden_size = max(r["length"] for r in group), all_features.shape[1]
    ids = torch.zeros(len(group), width, dtype=torch.long)
    feats = torch.zeros(len(group), width, hidden_size)
    attention = torch.zeros_like(ids)
    answer = torch.zeros(len(group), width, dtype=torch.bool)
    for b, r in enumerate(group):
        span = slice(r["start"], r["start"] + r["length"])
        ids[b, : r["length"]], feats[b, : r["length"]] = all_ids[span], all_features[span].float()
        attention[b, : r["length"]] = 1
        answer[b, r["prompt_len"] - 1 : r["length"] - 1] = True
    next_ids = torch.zeros_like(ids)
    next_ids[:, :-1] = ids[:, 1:]
    return tuple(t.to(device) for t in (ids, feats, attention, answer, next_ids))


def shifted(x: torch.Tensor) -> torch.Tensor:
    """[B, T, H] -> the row of position t - 1 at t (zeros at t = 0): what position t reads."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)


def feature_loss(net, head_weight, head_rows, batch, unroll: int, reg: float, scale: float):
    """Loss and greedy agreement with the target's tokens per drafting depth (1 + unroll of them)."""
    ids, feats, attention, answer, next_ids = batch
    targets = feats[answer]  # f_t at the positions that predict an answer token
    p_target = torch.softmax(targets @ head_weight.T, dim=-1)
    read = shifted(feats)
    loss, agreement = 0.0, []
    for _ in range(1 + unroll):
        estimates = net(ids, read, attention_mask=attention)
        chosen = estimates[answer]
        log_q = torch.log_softmax(chosen @ head_weight.T, dim=-1)
        loss = loss + -(p_target * log_q).sum(-1).mean()
        loss = loss + reg * torch.nn.functional.smooth_l1_loss(chosen / scale, targets / scale)
        agreement.append(float((head_rows[log_q.argmax(-1)] == next_ids[answer]).float().mean()))
        read = shifted(estimates)  # the next depth reads the draft's own estimates
    return loss, agreement


def init_feature_net(target_model, layers_from: list[int], feature_scale: float, token_draft=None):
    """Blocks copied from a token-only draft (distill_draft.py's, when given) or else from the
    target's; fuse = [identity on the token's embedding, 0 on the feature]. So training starts from
    exactly that token-only model and learns to read the feature on top of it."""
    source = token_draft.get_decoder() if token_draft is not None else target_model.get_decoder()
    layers = list(range(len(source.layers))) if token_draft is not None else layers_from
    config = {**distill_draft.draft_config(target_model.config.to_dict(), len(layers)), "draft_kind": FEATURE_KIND,
              "feature_scale": feature_scale}
    net = build_feature_net(config, target_model)
    for i, j in enumerate(layers):
        net.model.get_decoder().layers[i].load_state_dict(source.layers[j].state_dict())
    net.model.get_decoder().norm.load_state_dict(source.norm.state_dict())
    hidden_size = target_model.config.hidden_size
    with torch.no_grad():
        net.fuse.weight.zero_()
        net.fuse.weight[:, :hidden_size] = torch.eye(hidden_size)
        net.fuse.bias.zero_()
    return net, config


def train(args) -> None:
    torch.manual_seed(args.seed)
    work = Path(args.work)
    all_features, all_ids, records = load_features(work / "features.npz")
    held_out, own = records[: args.held_out], records[args.held_out :]  # features.npz is in shuffled order
    device = torch.device(args.device)
    target_model, tokenizer = load_embedded_target(device, torch.float32)
    target_model.requires_grad_(False)
    vocab_size = target_model.get_output_embeddings().weight.shape[0]
    answers = [{"ids": all_ids[r["start"] : r["start"] + r["length"]], "prompt_len": r["prompt_len"]} for r in own]
    layers_from = [int(x) for x in args.layers_from.split(",")]
    start_draft = load_draft_weights(Path(args.init_from), target_model) if args.init_from else None
    if start_draft is not None:  # keep the rows that draft was trained for
        head_rows = draft_lm(start_draft).get_output_embeddings().rows
    else:
        head_rows = distill_draft.frequent_tokens(answers, args.head_size, vocab_size,
                                                  list(stop_token_ids(tokenizer, target_model))).to(device)
    head_weight = target_model.get_output_embeddings().weight.detach()[head_rows]
    scale = float(all_features[:200_000].float().pow(2).mean().sqrt())  # the features' RMS
    if isinstance(start_draft, FeatureNet):  # a feature draft (the shipped one, by default): train it further
        net, config = start_draft.train(), json.loads((Path(args.init_from) / "config.json").read_text())
    else:
        embedding_rms = float(target_model.get_input_embeddings().weight.detach().pow(2).mean().sqrt())
        net, config = init_feature_net(target_model, layers_from, embedding_rms / scale, start_draft)
    for name, p in net.named_parameters():  # the target's embedding and head stay as they are
        p.requires_grad_("embed" not in name and "lm_head" not in name and (not args.fuse_only or "fuse" in name))
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    batches = token_batches(own, args.batch_tokens)
    held_batches = [padded(g, all_features, all_ids, device) for g in token_batches(held_out, args.batch_tokens)]
    answer_tokens = sum(r["length"] - r["prompt_len"] for r in own)
    print(f"training on {len(own)} answers ({answer_tokens} answer tokens, {len(batches)} batches), "
          f"{len(held_out)} held out; {sum(p.numel() for p in params)} trainable parameters", flush=True)
    rng = random.Random(args.seed)
    started = time.time()

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    @torch.no_grad()
    def held_out_agreement() -> list[float]:
        net.eval()
        totals, count = None, 0
        for batch in held_batches:
            with autocast():
                _, agreement = feature_loss(net, head_weight, head_rows, batch, args.unroll, args.reg, scale)
            weight = int(batch[3].sum())
            totals = [(totals[i] if totals else 0.0) + a * weight for i, a in enumerate(agreement)]
            count += weight
        net.train()
        return [t / count for t in totals]

    start_agreement = held_out_agreement()  # the starting model: the token-only draft, when given
    print(f"held-out agreement per depth before training {[round(a, 4) for a in start_agreement]}", flush=True)
    best, step, order, history = -1.0, 0, [], [(0, 0.0, None, [round(a, 4) for a in start_agreement])]
    bar = tqdm(desc="train (features)", mininterval=10)
    while time.time() - started < args.minutes * 60 and step < args.steps:
        if not order:
            order = list(range(len(batches)))
            rng.shuffle(order)
        progress = min(1.0, (time.time() - started) / (args.minutes * 60))
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * progress))
        with autocast():
            batch = padded(batches[order.pop()], all_features, all_ids, device)
            loss, agreement = feature_loss(net, head_weight, head_rows, batch, args.unroll, args.reg, scale)
        distill_draft.optimizer_step(optimizer, loss, params)
        step += 1
        bar.update(1)
        if distill_draft.time_to_evaluate(step, args, started):
            held = held_out_agreement()
            history.append((step, round(time.time() - started, 1), round(loss.item(), 4), [round(a, 4) for a in held]))
            print(f"\nstep {step}: loss {loss.item():.3f}, batch agreement {[round(a, 3) for a in agreement]}, "
                  f"held-out agreement per depth {[round(a, 4) for a in held]}, {time.time() - started:.0f} s", flush=True)
            if held[0] >= best:
                best = held[0]
                torch.save({"draft": {k: v.detach().clone() for k, v in net.state_dict().items()
                                      if "embed" not in k and "lm_head" not in k},
                            "step": step, "head_rows": head_rows.cpu(), "config": config,
                            "layers_from": None if start_draft is not None else layers_from,
                            "held_out_agreement": held[0], "held_out_agreement_per_depth": held,
                            "train_seconds": time.time() - started, "answer_tokens": answer_tokens,
                            "answers": len(own), "history": history, "recipe": vars(args)},
                           work / "feature_best.pt")
    bar.close()


def main() -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--work", default=str(distill_draft.DEFAULT_WORK), help="folder with generated.npz")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--threads", type=int, default=2)
    common.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_features = sub.add_parser("features", parents=[common])
    p_features.add_argument("--feature-tokens", type=int, default=1_200_000, help="positions to extract, prompts included")
    p_features.add_argument("--feature-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p_features.add_argument("--max-len", type=int, default=512, help="answers are cut at this many tokens")
    p_train = sub.add_parser("train", parents=[common])
    p_train.add_argument("--minutes", type=float, default=18.0)
    p_train.add_argument("--steps", type=int, default=1_000_000, help="at most; the time budget usually ends first")
    p_train.add_argument("--init-from", default=str(EMBEDDED_DRAFT_DIR),
                         help="a draft folder to start from (distill_draft.py export): a token-only draft gets a fuse layer "
                              "that first ignores the feature; a feature draft is trained further; '' for target blocks")
    p_train.add_argument("--layers-from", default="0", help="with --init-from '': the target blocks the draft's blocks start from")
    p_train.add_argument("--head-size", type=int, default=8192)
    p_train.add_argument("--batch-tokens", type=int, default=4096, help="padded positions per step")
    p_train.add_argument("--unroll", type=int, default=1, help="extra passes on the draft's own estimates")
    p_train.add_argument("--reg", type=float, default=0.1, help="weight of the feature-estimate L1 term")
    p_train.add_argument("--lr", type=float, default=2e-4)
    p_train.add_argument("--weight-decay", type=float, default=0.01)
    p_train.add_argument("--bf16", action="store_true", help="bf16 autocast (on a GPU, or a CPU that has it)")
    p_train.add_argument("--fuse-only", action="store_true", help="train the fuse layer only (blocks frozen)")
    p_train.add_argument("--eval-every", type=int, default=100)
    p_train.add_argument("--held-out", type=int, default=256, help="answers of features.npz kept for evaluation")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    {"features": features, "train": train}[args.command](args)


if __name__ == "__main__":
    main()
