"""Recipe of an EAGLE-3 head for the embedded target: the target's own answers -> the authors' training -> export.

    # the answers: the shipped draft's recipe (GSM8K *train*, written prompts, self-instruct; never an evaluation set)
    python scripts/distill_draft.py generate --device cpu --work runs/eagle3 --generate-minutes 30 \
        --batch-generate 64 --max-new-tokens 256 --self-instruct 512
    python scripts/train_eagle3.py train --work runs/eagle3 --train-minutes 60   # resumable: run it again to go on
    python scripts/train_eagle3.py export --work runs/eagle3 --out assets/eagle3

As SafeAILab/EAGLE's traineagle3 (cnets.Model, main.py) trains EAGLE-3:
  - the draft vocabulary: the N most frequent answer tokens, sorted; d2t[i] = used[i] - i, t2d a mask over the
    target's vocabulary (cnets.Model.scandata);
  - the head reads fc([the inputs of target layers 2, L // 2, L - 3]) and the embedding of the next token (the
    target's, frozen); one decoder layer; the final norm and lm_head over the draft vocabulary;
  - the training-time test: 7 steps; step i's query at position j attends to positions <= j of step 0 and to
    position j of steps 1..i (the chain a round drafts), at rotary position j + i; each step reads the previous
    step's outputs and the tokens one further on; loss = cross-entropy against the target's softmax over the draft
    vocabulary, where the target's argmax is in it and the position is an answer token; weights 0.8^i;
  - AdamW (betas 0.9, 0.95, no weight decay), linear warm-up then linear decay, gradients clipped at 0.5, seed 0;
    each step's held-out accuracy (the head's argmax = the target's) is its acceptance curve.
Departures, for a two-core CPU in under two hours (said again in recipe.json):
  - lm_head starts from the target's own rows of the draft vocabulary (the authors' starts random), as the
    shipped draft's head does; the layer and fc start as the authors' (PyTorch's default initialisation);
  - the target's features are computed once per answer and kept (bfloat16), not recomputed every epoch;
  - float32 on CPU (the authors' fp16 with DeepSpeed on GPUs); a time budget, not 40 epochs; the best held-out
    checkpoint is kept.
  - an answer's last position is not counted (its label would be padding).
`--device cuda` runs the same recipe on a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import Counter
from pathlib import Path

import torch

from dropmatch.decoding import eagle3
from dropmatch.models import load_embedded_target
from tools.generation import load_generated

ROOT = Path(__file__).resolve().parent.parent
STEPS = 7  # the authors' training-time test length (cnets.Model.length)
STEP_WEIGHT = 0.8  # step i's loss weight is 0.8^i (main.py)


# ---------------------------------------------------------------- data


def draft_vocabulary(records: list[dict], size: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(used [N] target ids, sorted; d2t [N]; t2d [V] bool): the `size` most frequent answer tokens (scandata)."""
    counts = Counter()
    for record in records:
        counts.update(record["ids"][record["prompt_len"]:].tolist())
    used = torch.tensor(sorted(token for token, _ in counts.most_common(size)), dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return used, used - torch.arange(len(used)), t2d


@torch.no_grad()
def target_features(model, records: list[dict], layer_ids: tuple[int, ...], max_len: int) -> list[dict]:
    """Each answer with the target's inputs to `layer_ids` (fused [T, 3 H]) and its lm_head's input [T, H], bf16:
    what every epoch reads (computed once), with "top" [T]: the target's argmax over its whole vocabulary (the
    authors' target_max_token) and "loss_mask" [T] (answer tokens)."""
    captured = {}
    hook = model.get_output_embeddings().register_forward_hook(lambda m, inputs, out: captured.update(x=inputs[0]))
    out_records = []
    try:
        for record in records:
            ids = record["ids"][:max_len].long()
            out = model(input_ids=ids[None].to(model.device), output_hidden_states=True, use_cache=False,
                        logits_to_keep=0)
            fused = torch.cat([out.hidden_states[i][0] for i in layer_ids], -1).cpu()  # layer i's input
            mask = torch.zeros(len(ids), dtype=torch.bool)
            mask[record["prompt_len"]:] = True
            out_records.append({"ids": ids, "features": fused.bfloat16(), "head_in": captured["x"][0].cpu().bfloat16(),
                                "top": out.logits[0].argmax(-1).cpu(), "loss_mask": mask})
    finally:
        hook.remove()
    return out_records


def batch_of(records: list[dict], device="cpu") -> dict[str, torch.Tensor]:
    """Right-padded [B, T] ids and mask, [B, T, 3 H] features, [B, T, H] lm_head inputs (zeros past each end),
    on `device`."""
    width = max(len(r["ids"]) for r in records)

    def padded(key, dtype=None):
        first = records[0][key]
        out = torch.zeros(len(records), width, *first.shape[1:], dtype=dtype or first.dtype)
        for b, record in enumerate(records):
            out[b, : len(record[key])] = record[key]
        return out

    batch = {"ids": padded("ids"), "top": padded("top"), "loss_mask": padded("loss_mask"),
             "features": padded("features", torch.float32), "head_in": padded("head_in", torch.float32)}
    return {key: value.to(device) for key, value in batch.items()}


def shift(tensor: torch.Tensor) -> torch.Tensor:
    """The authors' padding(tensor, left=False): one position on, zeros at the end."""
    return torch.cat([tensor[:, 1:], torch.zeros_like(tensor[:, -1:])], 1)


# ---------------------------------------------------------------- the training-time test


def ttt_attention(attn: eagle3.Attention, x: torch.Tensor, cos, sin, keys: list, values: list) -> torch.Tensor:
    """x [B, T, 2 H] of step i = len(keys) -> [B, T, H]. The query at j sees step 0's keys at positions <= j and
    steps 1..i's keys at j (cnets.LlamaAttention with cache_hidden); keys, values grow by this step's."""
    batch, width, _ = x.shape
    q = attn.q_proj(x).view(batch, width, attn.heads, attn.head_dim)
    k = attn.k_proj(x).view(batch, width, attn.kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(batch, width, attn.kv_heads, attn.head_dim).transpose(1, 2)
    if attn.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = eagle3.rotate(q.transpose(1, 2), cos, sin), eagle3.rotate(k.transpose(1, 2), cos, sin)
    group = attn.heads // attn.kv_heads
    keys.append(k.repeat_interleave(group, 1))
    values.append(v.repeat_interleave(group, 1))
    scale = 1 / math.sqrt(attn.head_dim)
    causal = torch.ones(width, width, dtype=torch.bool, device=x.device).tril()
    scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]  # [B, h, T, T]
    scores += [((q * later).sum(-1) * scale)[..., None] for later in keys[1:]]  # [B, h, T, 1] each
    weights = torch.softmax(torch.cat(scores, -1).float(), -1).to(q.dtype)
    out = weights[..., :width] @ values[0]
    for i, later in enumerate(values[1:]):
        out = out + weights[..., width + i, None] * later
    return attn.o_proj(out.transpose(1, 2).reshape(batch, width, attn.heads * attn.head_dim))


def ttt_steps(module: eagle3.HeadModule, embedding, ids: torch.Tensor, features: torch.Tensor) -> list[torch.Tensor]:
    """The authors' training-time test (cnets.Model.forward): ids [B, T], features [B, T, 3 H] (the target's, at
    the same positions) -> each step's layer outputs [B, T, H]. Step i at position j reads the token at j + 1 + i
    and drafts the one at j + 2 + i, as the i-th step of a round that read the target up to position j does."""
    layer = module.layers[0]
    hidden, keys, values, outputs = module.fc(features), [], [], []
    width = ids.shape[1]
    for step in range(STEPS):
        ids = shift(ids)
        cos, sin = module.rotary(hidden, torch.arange(step, step + width, device=ids.device)[None])
        normed = layer.hidden_norm(hidden)
        residual = normed if layer.norm_before_residual else hidden
        mixed = torch.cat([layer.input_layernorm(embedding(ids).to(hidden.dtype)), normed], -1)
        out = residual + ttt_attention(layer.self_attn, mixed, cos[0], sin[0], keys, values)
        hidden = out + layer.mlp(layer.post_attention_layernorm(out))
        outputs.append(hidden)
    return outputs


def ttt_losses(module: eagle3.HeadModule, embedding, head_rows: torch.Tensor, t2d: torch.Tensor,
               batch: dict) -> tuple[list[torch.Tensor], list[float]]:
    """Per step: the loss (cross-entropy against the target's softmax over the draft vocabulary, where its argmax
    is in it and the position is an answer token) and the accuracy over answer positions. head_rows [N, H]: the
    target's lm_head rows of the draft vocabulary. As the authors' (cnets.Model.dataprepare and forward), step i at
    position j is labelled by the target at j + 1 + i and counted by the loss mask at j + i; an answer's last
    position, whose label would be padding, is not counted (a departure: the authors' label there is the target's
    logits at a pad token)."""
    mask = (batch["loss_mask"] * shift(batch["loss_mask"]))[..., None].float()
    target = shift(batch["head_in"]) @ head_rows.T  # [B, T, N]: the target's logits over the draft vocabulary
    in_vocab = t2d[shift(batch["top"])]  # the target's argmax (over its whole vocabulary) is in the draft vocabulary
    losses, accuracies = [], []
    for step, out in enumerate(ttt_steps(module, embedding, batch["ids"], batch["features"])):
        if step:
            target, mask, in_vocab = shift(target), shift(mask), shift(in_vocab)
        logits = module.lm_head(module.norm(out)).float()
        label = torch.softmax(target, -1)
        counted = in_vocab[..., None].float() * mask
        losses.append(-(counted * label * torch.log_softmax(logits, -1)).sum(-1).mean())
        hits = (logits.argmax(-1) == label.argmax(-1)).float() * counted[..., 0]
        accuracies.append(float(hits.sum() / (mask.sum() + 1e-6)))
    return losses, accuracies


# ---------------------------------------------------------------- the loop


def head_spec(target_config, layer_ids, draft_vocab: int) -> eagle3.HeadSpec:
    """A one-layer head the width of the target, its layer a Llama layer with the target's sizes."""
    from transformers import LlamaConfig

    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
            "vocab_size", "max_position_embeddings", "rope_theta", "rope_scaling", "head_dim")
    config = {key: getattr(target_config, key) for key in keep if getattr(target_config, key, None) is not None}
    return eagle3.HeadSpec(LlamaConfig(**config, num_hidden_layers=1), draft_vocab, target_config.hidden_size,
                           tuple(layer_ids))


def held_out_curve(module, embedding, head_rows, t2d, held: list[dict], batch_size: int) -> list[float]:
    """Each step's accuracy on the held-out answers (the authors' test loop), weighted by answer tokens."""
    totals, weight = [0.0] * STEPS, 0.0
    module.eval()
    with torch.no_grad():
        for i in range(0, len(held), batch_size):
            batch = batch_of(held[i : i + batch_size], head_rows.device)
            _, accuracies = ttt_losses(module, embedding, head_rows, t2d, batch)
            tokens = float(batch["loss_mask"].sum())
            totals = [t + a * tokens for t, a in zip(totals, accuracies)]
            weight += tokens
    module.train()
    return [round(t / max(weight, 1.0), 4) for t in totals]


def train(args, model=None) -> None:
    """Resumable: WORK/eagle3_state.pt holds the module, optimizer, step and time so far; a run goes on until the
    total training time reaches --train-minutes (or --steps). model: the target (default: the embedded one)."""
    torch.manual_seed(args.seed)
    model = model or load_embedded_target(torch.device(args.device), torch.float32)[0]
    model.requires_grad_(False)
    run = prepare(args, model)
    device = run["head_rows"].device
    batches = [run["own"][i : i + args.batch] for i in range(0, len(run["own"]), args.batch)]
    state, module, optimizer = run["state"], run["module"], run["optimizer"]
    rng = random.Random(args.seed + state["step"])
    budget = args.train_minutes * 60 or math.inf  # 0 minutes: --steps alone bounds the run
    clock = time.time()
    module.train()
    while state["step"] < args.steps and state["seconds"] + (time.time() - clock) < budget:
        progress = max(state["step"] / args.steps, (state["seconds"] + time.time() - clock) / budget)
        for group in optimizer.param_groups:  # WarmupDecayLR: linear up, linear down
            group["lr"] = args.lr * min(1.0, (state["step"] + 1) / args.warmup) * max(0.0, 1.0 - progress)
        losses, _ = ttt_losses(module, run["embedding"], run["head_rows"], run["t2d"], batch_of(rng.choice(batches), device))
        loss = sum(STEP_WEIGHT ** i * step_loss for i, step_loss in enumerate(losses))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 0.5)
        optimizer.step()
        state["step"] += 1
        done = state["step"] >= args.steps or state["seconds"] + time.time() - clock >= budget
        if state["step"] % args.eval_every == 0 or done:
            state["seconds"] += time.time() - clock
            checkpoint(args, run, loss.item())
            clock = time.time()


def prepare(args, model) -> dict:
    """The answers (held out first, by the authors' shuffle), the draft vocabulary, the module with the target's
    rows in lm_head, the optimizer, the state so far (a resumed run's), and the target's features."""
    work = Path(args.work)
    records, runs = load_generated(work / "generated.npz")
    records = [r for r in records if len(r["ids"]) > r["prompt_len"] + 1]
    random.Random(42).shuffle(records)  # the authors' ds.shuffle(seed=42)
    if len(records) <= args.held_out:
        raise SystemExit(f"error: {len(records)} answers in {work / 'generated.npz'}: none left after --held-out "
                         f"{args.held_out}; generate more first")
    layer_ids = (tuple(int(i) for i in args.layers.split(",")) if args.layers
                 else eagle3.default_layer_ids(model.config.num_hidden_layers))
    saved = (torch.load(work / "eagle3_state.pt", weights_only=False, map_location=model.device)
             if (work / "eagle3_state.pt").exists() else None)
    own_raw = records[args.held_out :]
    used, d2t, t2d = saved["vocabulary"] if saved else draft_vocabulary(own_raw, args.draft_vocab, model.config.vocab_size)
    head_rows = model.get_output_embeddings().weight.detach()[used]
    module = eagle3.HeadModule(head_spec(model.config, layer_ids, len(used)), len(layer_ids)).to(model.device)
    module.d2t.copy_(d2t)
    t2d = t2d.to(model.device)
    with torch.no_grad():
        module.lm_head.weight.copy_(head_rows)  # the warm start (a departure: see the docstring)
    optimizer = torch.optim.AdamW(module.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    state = {"step": 0, "seconds": 0.0, "history": [], "best": -1.0}
    if saved:
        module.load_state_dict(saved["module"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
        torch.set_rng_state(saved["rng"].cpu())
        print(f"resuming at step {state['step']} ({state['seconds']:.0f} s trained)", flush=True)
    started = time.time()
    own = sorted(target_features(model, own_raw, layer_ids, args.max_len), key=lambda r: len(r["ids"]))
    held = target_features(model, records[: args.held_out], layer_ids, args.max_len)
    answer_tokens = int(sum(r["loss_mask"].sum() for r in own))
    print(f"{len(own)} answers ({answer_tokens} answer tokens) to train on, {len(held)} held out; draft vocabulary "
          f"{len(used)}; the target's features (layers {list(layer_ids)}) in {time.time() - started:.0f} s", flush=True)
    return {"own": own, "held": held, "answer_tokens": answer_tokens, "generation": runs, "layer_ids": layer_ids,
            "vocabulary": (used, d2t, t2d), "t2d": t2d, "head_rows": head_rows, "module": module,
            "optimizer": optimizer, "state": state, "embedding": model.get_input_embeddings()}


def checkpoint(args, run: dict, loss: float) -> None:
    """The held-out curve into the history; the best checkpoint kept; the state saved for a resumed run."""
    state, module, work = run["state"], run["module"], Path(args.work)
    curve = held_out_curve(module, run["embedding"], run["head_rows"], run["t2d"], run["held"], args.batch)
    state["history"].append([state["step"], round(state["seconds"]), round(loss, 4), curve])
    print(f"step {state['step']}: loss {loss:.3f}, held-out accuracy by step {curve}, {state['seconds']:.0f} s",
          flush=True)
    if sum(curve) > state["best"]:
        state["best"] = sum(curve)
        torch.save({"module": module.state_dict(), "t2d": run["t2d"], "layer_ids": run["layer_ids"], "curve": curve,
                    "step": state["step"], "seconds": state["seconds"], "answers": len(run["own"]),
                    "answer_tokens": run["answer_tokens"], "generation": run["generation"], "recipe": vars(args)},
                   work / "eagle3_best.pt")
    torch.save({"module": module.state_dict(), "optimizer": run["optimizer"].state_dict(), "state": state,
                "rng": torch.get_rng_state(), "vocabulary": run["vocabulary"]}, work / "eagle3_state.pt")


def export(args, model=None) -> None:
    """The best held-out checkpoint -> OUT/{config.json, model.safetensors, recipe.json} in the authors' format
    (SafeAILab's keys: midlayer.*, fc, norm, lm_head, d2t, t2d); eagle3.load_head reads it."""
    from safetensors.torch import save_file

    work, out = Path(args.work), Path(args.out)
    best = torch.load(work / "eagle3_best.pt", weights_only=False, map_location="cpu")
    model = model or load_embedded_target(torch.device("cpu"), torch.float32)[0]
    spec = head_spec(model.config, best["layer_ids"], best["module"]["lm_head.weight"].shape[0])
    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **spec.layer.to_diff_dict(),
              "draft_vocab_size": spec.draft_vocab_size, "target_hidden_size": spec.target_hidden_size,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(best["layer_ids"])}}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {key.replace("layers.0.", "midlayer."): value.contiguous() for key, value in best["module"].items()}
    save_file({**tensors, "t2d": best["t2d"]}, str(out / "model.safetensors"))
    recipe = {key: best[key] for key in ("curve", "step", "seconds", "answers", "answer_tokens", "generation", "recipe")}
    recipe["departures"] = ("lm_head starts from the target's rows of the draft vocabulary; the target's features are "
                            "computed once; float32 on CPU; a time budget; the best held-out checkpoint; an answer's "
                            "last position is not counted")
    (out / "recipe.json").write_text(json.dumps(recipe, indent=1))
    print(f"wrote {out}: held-out accuracy by step {best['curve']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--work", default=str(ROOT / "runs" / "eagle3"), help="generated.npz and the checkpoints")
    p_train = commands.add_parser("train", parents=[common])
    p_train.add_argument("--train-minutes", type=float, default=60.0, help="total training time, over resumed runs")
    p_train.add_argument("--steps", type=int, default=1_000_000, help="at most; the time budget usually ends first")
    p_train.add_argument("--draft-vocab", type=int, default=8192, help="the draft vocabulary's size N")
    p_train.add_argument("--batch", type=int, default=8, help="answers per step")
    p_train.add_argument("--max-len", type=int, default=512)
    p_train.add_argument("--lr", type=float, default=5e-4)
    p_train.add_argument("--warmup", type=int, default=100, help="steps of linear warm-up")
    p_train.add_argument("--eval-every", type=int, default=200)
    p_train.add_argument("--held-out", type=int, default=64, help="answers kept for the acceptance curve")
    p_train.add_argument("--seed", type=int, default=0)
    p_train.add_argument("--device", default="cpu", help="cpu, or cuda for the same recipe on a GPU")
    p_train.add_argument("--layers", default="", help="the target layers fused (default: the authors' 2, L // 2, L - 3)")
    p_export = commands.add_parser("export", parents=[common])
    p_export.add_argument("--out", default=str(ROOT / "assets" / "eagle3"))
    args = parser.parse_args()
    {"train": train, "export": export}[args.command](args)


if __name__ == "__main__":
    main()
