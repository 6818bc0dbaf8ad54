"""Recipe of the shipped draft (assets/draft): teacher data -> distillation -> export.

The shipped draft was made on one CUDA GPU in one command (about 8 minutes on an H200):

    python scripts/distill_draft.py gpu --device cuda --work runs/distill_gpu --out assets/draft

which runs `generate` (greedy target answers to every training prompt, batched, ids only),
`train --online` (distillation against the target's full distributions, computed live) and `export`.
The older CPU recipe stores the target's top-16 log-probabilities instead (no GPU needed):

    python scripts/distill_draft.py teacher   # target answers to training prompts (resumable)
    python scripts/distill_draft.py train     # distil the small draft (checkpoints, resumable)
    python scripts/distill_draft.py export    # write assets/draft/{config.json,draft.safetensors}

Training prompts: GSM8K *train* questions, prompts written from templates below and questions the
target itself writes about listed topics (self-instruct). Never the GSM8K test set, HumanEval,
MT-Bench or IFEval (those are what the draft is evaluated on).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dropmatch.models import EMBEDDED_DRAFT_DIR, encode_prompt, load_embedded_target, stop_token_ids  # noqa: E402

DEFAULT_WORK = ROOT / "runs" / "distill"
DEFAULT_GSM8K_TRAIN = ROOT.parent / "shared" / "benchmarks" / "gsm8k_train.jsonl"
TOP_K = 16

TOPICS = [
    "the ocean", "autumn leaves", "a city at night", "friendship", "learning to code", "coffee",
    "space exploration", "a lost cat", "climate change", "the first day of school", "mountains",
    "electric cars", "a rainy afternoon", "honey bees", "the internet", "a small bakery",
    "volcanoes", "chess", "a train journey", "recycling", "the moon", "music festivals",
    "a grandmother's garden", "robots", "healthy breakfasts", "the Roman Empire", "photosynthesis",
    "remote work", "a thunderstorm", "solar panels", "libraries", "a job interview",
    "the human heart", "bicycles", "time management", "dinosaurs", "the stock market",
    "social media", "a camping trip", "vaccines", "the printing press", "public speaking",
]
TEMPLATES = [
    "Write a short poem about {t}.", "Write a short story about {t}.",
    "Write a blog post about {t}.", "Write a friendly email to a colleague about {t}.",
    "Explain {t} in simple terms.", "What are the pros and cons of {t}?",
    "Give me five tips related to {t}.", "Summarize what people should know about {t}.",
    "Describe {t} to a ten-year-old.", "Write a persuasive paragraph about {t}.",
    "List three interesting facts about {t}.", "Write a haiku about {t}.",
    "Write a dialogue between two friends about {t}.", "Write a tweet about {t}.",
    "Why is {t} important?", "Compare {t} and {u}.",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "merges two sorted lists", "finds the largest element of a list",
    "removes duplicates from a list while keeping order", "computes the factorial of n",
    "checks whether a string is a palindrome", "converts Celsius to Fahrenheit",
    "returns the sum of the digits of an integer", "flattens a nested list",
    "computes the greatest common divisor of two numbers", "sorts a list of dictionaries by a key",
    "counts word frequencies in a text", "returns the second largest number in a list",
    "checks whether two strings are anagrams", "computes the mean and median of a list",
    "transposes a matrix given as a list of lists", "finds all even numbers in a list",
]


def all_prompts(seed: int, gsm8k_train: Path = DEFAULT_GSM8K_TRAIN) -> tuple[list[str], list[str]]:
    """(GSM8K train questions, written prompts), each shuffled with the seed."""
    rng = random.Random(seed)
    questions = [json.loads(line)["question"] for line in Path(gsm8k_train).read_text().splitlines()]
    rng.shuffle(questions)
    written = []
    for template in TEMPLATES:
        for topic in TOPICS:
            other = rng.choice([t for t in TOPICS if t != topic])
            written.append(template.format(t=topic, u=other))
    for task in CODE_TASKS:
        written.append(f"Write a Python function that {task}.")
        written.append(f"Write a Python function that {task}, with a docstring and an example.")
    rng.shuffle(written)
    return questions, written


def training_prompts(num_gsm8k: int, num_written: int, seed: int, gsm8k_train: Path = DEFAULT_GSM8K_TRAIN) -> list[str]:
    questions, written = all_prompts(seed, gsm8k_train)
    return questions[:num_gsm8k] + written[:num_written]


def devset(args) -> None:
    """Held-out development prompts for tuning (p = auto's agreement): GSM8K train questions and
    written prompts that the teacher step did not use. Never the evaluation sets."""
    questions, written = all_prompts(args.seed, args.gsm8k_train)
    out = Path(args.work) / "dev.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    pairs = zip(questions[args.gsm8k : args.gsm8k + args.count], written[args.written : args.written + args.count])
    lines = [json.dumps({"prompt": prompt}) for pair in pairs for prompt in pair]  # interleaved: --limit takes both
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(lines)} prompts")


def teacher(args) -> None:
    """Greedy target answers with the target's top-k log-probabilities at every answer position."""
    out_dir = Path(args.work) / "teacher"
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_embedded_target(torch.device("cpu"))
    stops = list(stop_token_ids(tokenizer, model))
    prompts = training_prompts(args.gsm8k, args.written, args.seed, args.gsm8k_train)
    encoded = sorted((encode_prompt(tokenizer, p) for p in prompts), key=len)
    batches = [encoded[i : i + args.batch] for i in range(0, len(encoded), args.batch)]
    rng = random.Random(args.seed)
    order = list(range(len(batches)))
    rng.shuffle(order)  # so a partial run still covers short and long prompts
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    for shard in tqdm(order, desc="teacher batches"):
        path = out_dir / f"shard_{shard:04d}.pt"
        if path.exists():
            continue
        batch = batches[shard]
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids, attention_mask=attention, max_new_tokens=args.max_new_tokens,
                do_sample=False, eos_token_id=stops, pad_token_id=pad,
                output_logits=True, return_dict_in_generate=True,
            )
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # [B, T, V]
        top_logprobs, top_ids = logprobs.topk(TOP_K, dim=-1)
        records = []
        for row, ids in enumerate(batch):
            answer = out.sequences[row, width:].tolist()
            length = next((i + 1 for i, token in enumerate(answer) if token in stops), len(answer))
            records.append({
                "ids": torch.tensor(ids + answer[:length], dtype=torch.int32),
                "prompt_len": len(ids),
                "top_ids": top_ids[row, :length].to(torch.int32),
                "top_logprobs": top_logprobs[row, :length].half(),
            })
        torch.save(records, path)


def forced(args) -> None:
    """Teacher forcing on GSM8K *train* reference answers: one target forward per batch gives the
    target's top-k at every answer position, far faster than generating. Questions from
    --skip on (the first ones feed the generated teacher data and the dev set)."""
    out_dir = Path(args.work) / "forced"
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_embedded_target(torch.device("cpu"))
    rows = [json.loads(line) for line in Path(args.gsm8k_train).read_text().splitlines()]
    questions, _ = all_prompts(args.seed, args.gsm8k_train)
    answer_of = {r["question"]: r["answer"] for r in rows}
    pairs = [(q, answer_of[q]) for q in questions[args.skip :]]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batches = [pairs[i : i + args.batch] for i in range(0, len(pairs), args.batch)]
    started = time.time()
    for shard, batch in enumerate(tqdm(batches, desc="forced batches")):
        path = out_dir / f"shard_{shard:04d}.pt"
        if path.exists():
            continue
        if time.time() - started > args.minutes * 60:
            break
        encoded = []
        for question, answer in batch:
            prompt = encode_prompt(tokenizer, question)
            text = re.sub(r"<<[^>]*>>", "", answer).replace("####", "The answer is") + "<|im_end|>"
            encoded.append((prompt, tokenizer(text, add_special_tokens=False)["input_ids"]))
        width = max(len(p) + len(a) for p, a in encoded)
        input_ids = torch.full((len(encoded), width), pad)
        attention = torch.zeros(len(encoded), width, dtype=torch.long)
        for b, (prompt, answer) in enumerate(encoded):
            input_ids[b, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
            attention[b, : len(prompt) + len(answer)] = 1
        with torch.inference_mode():
            logprobs = model(input_ids=input_ids, attention_mask=attention).logits.float().log_softmax(-1)
        top_logprobs, top_ids = logprobs.topk(TOP_K, dim=-1)
        records = []
        for b, (prompt, answer) in enumerate(encoded):
            positions = slice(len(prompt) - 1, len(prompt) + len(answer) - 1)  # predicting each answer token
            records.append({
                "ids": torch.tensor(prompt + answer, dtype=torch.int32),
                "prompt_len": len(prompt),
                "top_ids": top_ids[b, positions].to(torch.int32),
                "top_logprobs": top_logprobs[b, positions].half(),
            })
        torch.save(records, path)


# ---------------------------------------------------------------- training


def load_teacher(work: Path, folders=("teacher", "forced")) -> list[dict]:
    """Generated answers (the target's own text) and teacher-forced GSM8K train answers."""
    records = []
    for folder in folders:
        for path in sorted((work / folder).glob("shard_*.pt")):
            records.extend(torch.load(path))
    return [r for r in records if r["top_ids"].shape[0] > 0]


def frequent_tokens(records: list[dict], size: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    """The draft head's rows: the target's most frequent answer tokens, then the lowest ids
    (BPE gives low ids to frequent merges), plus the stop tokens; sorted ids [size]."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for record in records:
        answer = record["ids"][record["prompt_len"]:].long()
        counts.index_add_(0, answer, torch.ones_like(answer))
    score = counts.double() + (1.0 - torch.arange(vocab_size, dtype=torch.double) / vocab_size) * 0.5
    score[torch.tensor(always)] = float("inf")
    return score.topk(size).indices.sort().values


def coverage(records: list[dict], head_rows: torch.Tensor) -> float:
    inside = torch.zeros(int(head_rows.max()) + 1 + 100_000, dtype=torch.bool)
    inside[head_rows] = True
    answers = torch.cat([r["ids"][r["prompt_len"]:].long() for r in records])
    return float(inside[answers].float().mean())


def draft_config(target_config: dict, layers: int) -> dict:
    config = {k: v for k, v in target_config.items() if k not in ("_name_or_path", "quantization_config")}
    config["num_hidden_layers"] = layers
    config.pop("layer_types", None)
    return config


def init_draft(target_model, layers_from: list[int]):
    """A draft whose blocks start as copies of target blocks; embedding/head shared with the target."""
    from dropmatch.models import build_draft_model

    draft = build_draft_model(draft_config(target_model.config.to_dict(), len(layers_from)), target_model)
    source = target_model.get_decoder()
    for i, j in enumerate(layers_from):
        draft.get_decoder().layers[i].load_state_dict(source.layers[j].state_dict())
    draft.get_decoder().norm.load_state_dict(source.norm.state_dict())
    return draft


def make_batch(records: list[dict], row_of: torch.Tensor, max_len: int):
    """Right-padded inputs and, per answer position, the teacher's top-k restricted to the head rows."""
    seqs = [r["ids"][:max_len].long() for r in records]
    width = max(len(s) for s in seqs)
    input_ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attention = torch.zeros(len(seqs), width, dtype=torch.long)
    positions, top_rows, top_probs = [], [], []
    for b, (record, seq) in enumerate(zip(records, seqs)):
        input_ids[b, : len(seq)] = seq
        attention[b, : len(seq)] = 1
        start = record["prompt_len"] - 1
        count = min(record["top_ids"].shape[0], len(seq) - record["prompt_len"])
        for j in range(count):
            positions.append((b, start + j))
        rows = row_of[record["top_ids"][:count].long()]  # -1 where outside the head
        probs = record["top_logprobs"][:count].float().exp() * (rows >= 0)
        top_rows.append(rows.clamp_min(0))
        top_probs.append(probs / probs.sum(-1, keepdim=True).clamp_min(1e-9))
    index = torch.tensor(positions)
    return input_ids, attention, index, torch.cat(top_rows), torch.cat(top_probs)


def draft_loss(draft, head_weight, batch):
    """Cross-entropy of the draft's restricted distribution against the teacher's top-k
    (soft distillation); also returns greedy agreement with the teacher's argmax."""
    input_ids, attention, index, top_rows, top_probs = batch
    hidden = draft.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
    hidden = hidden[index[:, 0], index[:, 1]]  # [N, H]
    log_q = torch.log_softmax(hidden @ head_weight.T, dim=-1)  # [N, S]
    loss = -(top_probs * log_q.gather(-1, top_rows)).sum(-1).mean()
    agree = (log_q.argmax(-1) == top_rows[:, 0]).float().mean()
    return loss, agree


def train(args) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    target_model, tokenizer = load_embedded_target(torch.device("cpu"))
    target_model.requires_grad_(False)
    rng = random.Random(args.seed)
    generated, forced_records = load_teacher(Path(args.work), ("teacher",)), load_teacher(Path(args.work), ("forced",))
    rng.shuffle(generated)
    # Held out: only the target's own generated answers, the text a draft meets at inference time.
    held_out, own = generated[:args.held_out], generated[args.held_out:]
    records = own + forced_records
    vocab_size = target_model.get_output_embeddings().weight.shape[0]
    head_rows = frequent_tokens(records, args.head_size, vocab_size, list(stop_token_ids(tokenizer, target_model)))
    row_of = torch.full((vocab_size,), -1, dtype=torch.long)
    row_of[head_rows] = torch.arange(len(head_rows))
    answer_tokens = sum(int(r["top_ids"].shape[0]) for r in records)
    print(f"teacher: {len(records)} answers ({answer_tokens} tokens; {len(forced_records)} teacher-forced) for "
          f"training, {len(held_out)} generated answers held out; "
          f"head of {len(head_rows)} rows covers {coverage(held_out, head_rows):.3f} of held-out answer tokens",
          flush=True)
    layers_from = [int(x) for x in args.layers_from.split(",")]
    draft = init_draft(target_model, layers_from)
    draft.get_input_embeddings().requires_grad_(False)
    head_weight = target_model.get_output_embeddings().weight.detach()[head_rows]
    params = [p for n, p in draft.named_parameters() if p.requires_grad and "embed" not in n and "lm_head" not in n]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    ckpt_path = Path(args.work) / "draft_ckpt.pt"
    step = 0
    if ckpt_path.exists() and not args.restart:
        ckpt = torch.load(ckpt_path)
        draft.load_state_dict(ckpt["draft"], strict=False)
        optimizer.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
        print(f"resumed at step {step}", flush=True)
    def schedule(step: int) -> float:
        """Warm-up, then cosine to zero by whichever comes first: the last step or the time budget."""
        progress = max(step / args.steps, (time.time() - started) / (args.minutes * 60))
        return min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def length_batches(pool):
        pool = sorted(pool, key=lambda r: len(r["ids"]))
        return [pool[i : i + args.batch] for i in range(0, len(pool), args.batch)]

    # Half the batches from the target's own answers, whatever the amount of teacher-forced text.
    pools = [pool for pool in (length_batches(own), length_batches(forced_records)) if pool]
    started = time.time()
    best = -1.0
    bar = tqdm(total=args.steps, initial=step, desc="distil")
    draft.train()
    while step < args.steps and time.time() - started < args.minutes * 60:
        for group in optimizer.param_groups:
            group["lr"] = args.lr * schedule(step)
        loss, agree = draft_loss(draft, head_weight, make_batch(rng.choice(rng.choice(pools)), row_of, args.max_len))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", agree=f"{agree.item():.3f}")
        out_of_time = time.time() - started >= args.minutes * 60
        if step % args.eval_every == 0 or step == args.steps or out_of_time:
            held = evaluate(draft, head_weight, held_out, row_of, args)
            print(f"\nstep {step}: held-out greedy agreement {held:.3f}, {time.time() - started:.0f} s", flush=True)
            best = max(best, held)
            for path in [ckpt_path] + ([Path(args.work) / "draft_best.pt"] if held >= best else []):
                torch.save({"draft": {k: v for k, v in draft.state_dict().items() if "embed" not in k and "lm_head" not in k},
                        "optimizer": optimizer.state_dict(), "step": step, "head_rows": head_rows,
                        "layers_from": layers_from, "config": draft_config(target_model.config.to_dict(), len(layers_from)),
                        "held_out_agreement": held, "train_seconds": time.time() - started,
                        "answer_tokens": answer_tokens}, path)
    bar.close()


@torch.no_grad()
def evaluate(draft, head_weight, held_out, row_of, args) -> float:
    draft.eval()
    agree, total = 0.0, 0
    for i in range(0, len(held_out), args.batch):
        batch = make_batch(held_out[i : i + args.batch], row_of, args.max_len)
        _, batch_agree = draft_loss(draft, head_weight, batch)
        agree += float(batch_agree) * batch[2].shape[0]
        total += batch[2].shape[0]
    draft.train()
    return agree / max(total, 1)


def export(args) -> None:
    from safetensors.torch import save_file

    ckpt = torch.load(Path(args.work) / "draft_best.pt")  # the best held-out agreement, not merely the last step
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.to(torch.float16).contiguous() for name, tensor in ckpt["draft"].items()}
    tensors["head_rows"] = ckpt["head_rows"].to(torch.int32)
    save_file(tensors, str(out / "draft.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(ckpt["config"], indent=2))
    recipe = {k: ckpt[k] for k in ("step", "layers_from", "held_out_agreement", "train_seconds", "answer_tokens")}
    recipe["head_rows"] = int(ckpt["head_rows"].numel())
    recipe.update({k: ckpt[k] for k in ("answers", "history", "recipe") if k in ckpt})
    (out / "recipe.json").write_text(json.dumps(recipe, indent=2, default=str))
    print(f"wrote {out}: {recipe}")


# ---------------------------------------------------------------- GPU recipe: generated ids + online distillation

MORE_TOPICS = [
    "a trip to Japan", "the French Revolution", "machine learning", "black holes", "gardening",
    "the water cycle", "a startup idea", "meditation", "the Olympic Games", "renewable energy",
    "a family reunion", "quantum computing", "ancient Egypt", "the immune system", "budget travel",
    "a new smartphone", "electric guitars", "the Renaissance", "marathon training", "urban farming",
    "plate tectonics", "a museum visit", "personal finance", "the history of jazz", "cybersecurity",
    "a haunted house", "the Amazon rainforest", "video games", "sleep", "a wedding speech",
    "a customer complaint", "the theory of evolution", "sustainable fashion", "a science fair",
    "the Great Wall of China", "artificial intelligence ethics", "learning a new language",
    "a soccer match", "global trade", "the periodic table", "a road trip", "birdwatching",
    "the Industrial Revolution", "mental health", "a cooking class", "the speed of light",
    "democracy", "an old lighthouse", "3D printing", "a surprise party", "coral reefs",
]
MORE_TEMPLATES = [
    "Write a travel blog post about {t}.", "Draft a professional email about {t}.",
    "Write a product description related to {t}.", "Write an opening paragraph for a novel about {t}.",
    "Explain the main ideas behind {t} step by step.", "What are common misconceptions about {t}?",
    "Write a short speech about {t}.", "Create a lesson plan for teaching {t}.",
    "Give a balanced argument for and against {t}.", "How would you explain {t} to a beginner?",
    "Write a limerick about {t}.", "Write a news headline and a short article about {t}.",
    "Describe a typical day that involves {t}.", "What questions should I ask an expert on {t}?",
    "Write a short review of a book about {t}.", "Outline an essay on {t}.",
]
ROLES = [
    "a pirate captain", "a detective", "a medieval knight", "a friendly robot", "a famous chef",
    "a tour guide", "a science teacher", "a sports commentator", "a wise old wizard", "an astronaut",
    "a museum curator", "a startup founder", "a doctor", "a poet", "a customer service agent",
]
QUESTION_KINDS = [
    "a practical question", "a tricky reasoning question", "a question asking for advice",
    "a request for a creative piece of writing", "a question asking to compare two things",
    "a math word problem", "a question about history", "a request to explain a concept",
]


def gpu_written_prompts(seed: int) -> list[str]:
    """Template prompts for the GPU recipe: every template x topic, roles, code tasks; shuffled."""
    rng = random.Random(seed)
    topics = TOPICS + MORE_TOPICS
    prompts = []
    for template in TEMPLATES + MORE_TEMPLATES:
        for topic in topics:
            prompts.append(template.format(t=topic, u=rng.choice([t for t in topics if t != topic])))
    for role in ROLES:
        for topic in rng.sample(topics, 12):
            prompts.append(f"Pretend you are {role}. Tell me about {topic}.")
    for task in CODE_TASKS:
        prompts.append(f"Write a Python function that {task}.")
        prompts.append(f"Write a Python function that {task}, with a docstring and an example.")
        prompts.append(f"Explain how to write a program that {task}, then show the code.")
    rng.shuffle(prompts)
    return prompts


@torch.inference_mode()
def batched_generate(model, tokenizer, encoded: list[list[int]], *, batch: int, max_new_tokens: int,
                     deadline: float, sample: bool = False, desc: str = "generate") -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids up to and including the first stop token) for as many prompts as
    the deadline allows; batches of similar length, visited in a shuffled order so that a cut
    run still covers short and long prompts."""
    stops = list(stop_token_ids(tokenizer, model))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    encoded = sorted(encoded, key=len)
    batches = [encoded[i : i + batch] for i in range(0, len(encoded), batch)]
    random.Random(len(encoded)).shuffle(batches)
    results = []
    for group in tqdm(batches, desc=desc):
        if time.time() > deadline:
            print(f"{desc}: deadline reached after {len(results)} of {len(encoded)} prompts", flush=True)
            break
        width = max(len(ids) for ids in group)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in group], device=model.device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in group], device=model.device)
        options = dict(do_sample=True, temperature=0.8, top_p=0.95) if sample else dict(do_sample=False)
        out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                             eos_token_id=stops, pad_token_id=pad, **options)
        for row, ids in enumerate(group):
            answer = out[row, width:].tolist()
            length = next((i + 1 for i, token in enumerate(answer) if token in stops), len(answer))
            results.append((ids, answer[:length]))
    return results


def self_instruct(model, tokenizer, count: int, seed: int, batch: int, deadline: float) -> list[str]:
    """Questions the target writes itself about listed topics (sampled), as extra training prompts."""
    rng = random.Random(seed)
    topics = TOPICS + MORE_TOPICS
    asks = [f"Write {rng.choice(QUESTION_KINDS)} that a user might ask an AI assistant about {rng.choice(topics)}. "
            "Reply with the question only." for _ in range(count)]
    generated = batched_generate(model, tokenizer, [encode_prompt(tokenizer, a) for a in asks], batch=batch,
                                 max_new_tokens=64, deadline=deadline, sample=True, desc="self-instruct")
    questions = []
    for _, answer in generated:
        text = tokenizer.decode(answer, skip_special_tokens=True).strip().strip('"').split("\n")[0].strip()
        if 15 <= len(text) <= 300:
            questions.append(text)
    return sorted(set(questions))


def generate(args) -> None:
    """Greedy target answers (token ids only) to GSM8K train questions, template prompts and
    self-instruct questions, within a time budget; written to WORK/generated.pt."""
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    started = time.time()
    model, tokenizer = load_embedded_target(device, torch.float32)  # the text as the CPU target writes it
    loaded = time.time()  # the budget counts generation only, not the one-time GGUF conversion
    deadline = loaded + args.minutes * 60
    questions, _ = all_prompts(args.seed, args.gsm8k_train)
    # questions[700:720] are the dev set (devset command); never trained on
    questions = questions[:700] + questions[720:]
    written = gpu_written_prompts(args.seed)
    asked = self_instruct(model, tokenizer, args.self_instruct, args.seed, args.batch,
                          loaded + args.minutes * 60 * 0.15) if args.self_instruct else []
    print(f"prompts: {len(questions)} GSM8K train, {len(written)} written, {len(asked)} self-instruct, "
          f"for example {random.Random(args.seed).sample(asked, min(3, len(asked)))}", flush=True)
    sources = {}
    for source, prompts in (("gsm8k", questions), ("written", written), ("self", asked)):
        for prompt in prompts[: args.limit or None]:
            sources[tuple(encode_prompt(tokenizer, prompt))] = source
    pairs = batched_generate(model, tokenizer, [list(k) for k in sources], batch=args.batch,
                             max_new_tokens=args.max_new_tokens, deadline=deadline, desc="answers")
    records = [{"ids": torch.tensor(prompt + answer, dtype=torch.int32), "prompt_len": len(prompt),
                "source": sources[tuple(prompt)]} for prompt, answer in pairs if answer]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    torch.save(records, work / "generated.pt")
    tokens = sum(len(r["ids"]) - r["prompt_len"] for r in records)
    counts = {s: sum(r["source"] == s for r in records) for s in ("gsm8k", "written", "self")}
    print(f"generated {len(records)} answers ({tokens} answer tokens; {counts}) in {time.time() - started:.0f} s",
          flush=True)


def right_padded(records: list[dict], max_len: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids [B, T], attention [B, T], index [N, 2] of the positions that predict an answer
    token, and labels [N]: the token that follows each (the target's greedy choice)."""
    seqs = [r["ids"][:max_len].long() for r in records]
    width = max(len(s) for s in seqs)
    input_ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attention = torch.zeros(len(seqs), width, dtype=torch.long)
    positions = []
    for b, (record, seq) in enumerate(zip(records, seqs)):
        input_ids[b, : len(seq)] = seq
        attention[b, : len(seq)] = 1
        columns = torch.arange(record["prompt_len"] - 1, len(seq) - 1)
        positions.append(torch.stack([torch.full_like(columns, b), columns], dim=1))
    index = torch.cat(positions)
    labels = input_ids[index[:, 0], index[:, 1] + 1]
    return input_ids.to(device), attention.to(device), index.to(device), labels.to(device)


def online_loss(draft, target_model, head_weight, head_rows, batch, autocast: bool):
    """Cross-entropy of the draft's restricted distribution [N, S] against the target's own
    distribution over the same S head rows, computed live; and greedy agreement with the labels."""
    input_ids, attention, index, labels = batch
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        with torch.no_grad():
            target_hidden = target_model.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
            p_target = torch.softmax((target_hidden[index[:, 0], index[:, 1]] @ head_weight.T).float(), dim=-1)
        hidden = draft.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
        draft_logits = hidden[index[:, 0], index[:, 1]] @ head_weight.T
    log_q = torch.log_softmax(draft_logits.float(), dim=-1)
    loss = -(p_target * log_q).sum(-1).mean()
    agree = (head_rows[log_q.argmax(-1)] == labels).float().mean()
    return loss, agree


@torch.no_grad()
def target_agreement(target_model, head_weight, head_rows, batch, autocast: bool) -> float:
    """Sanity check of the data and the alignment of positions: the target's own restricted argmax
    against the labels (close to the head's coverage when the labels are its greedy tokens)."""
    input_ids, attention, index, labels = batch
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        hidden = target_model.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
        scores = hidden[index[:, 0], index[:, 1]] @ head_weight.T
    return float((head_rows[scores.argmax(-1)] == labels).float().mean())


def train_online(args) -> None:
    """Distil the draft against the target's live distributions on WORK/generated.pt."""
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    autocast = device.type == "cuda"
    if autocast:
        torch.backends.cuda.matmul.allow_tf32 = True
    work = Path(args.work)
    target_model, tokenizer = load_embedded_target(device, torch.float32)
    target_model.requires_grad_(False)
    rng = random.Random(args.seed)
    records = [r for r in torch.load(work / "generated.pt") if len(r["ids"]) > r["prompt_len"]]
    rng.shuffle(records)
    held_out, own = records[: args.held_out], records[args.held_out :]
    vocab_size = target_model.get_output_embeddings().weight.shape[0]
    head_rows = frequent_tokens(own, args.head_size, vocab_size, list(stop_token_ids(tokenizer, target_model))).to(device)
    answer_tokens = sum(len(r["ids"]) - r["prompt_len"] for r in own)
    print(f"training on {len(own)} answers ({answer_tokens} answer tokens), {len(held_out)} held out; head of "
          f"{len(head_rows)} rows covers {coverage(held_out, head_rows.cpu()):.3f} of held-out answer tokens", flush=True)
    layers_from = [int(x) for x in args.layers_from.split(",")]
    draft = init_draft(target_model, layers_from)
    draft.get_input_embeddings().requires_grad_(False)
    head_weight = target_model.get_output_embeddings().weight.detach()[head_rows]
    params = [p for n, p in draft.named_parameters() if p.requires_grad and "embed" not in n and "lm_head" not in n]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    own.sort(key=lambda r: len(r["ids"]))
    batches = [own[i : i + args.batch] for i in range(0, len(own), args.batch)]
    held_batches = [held_out[i : i + args.batch] for i in range(0, len(held_out), args.batch)]
    config = draft_config(target_model.config.to_dict(), len(layers_from))
    sanity = target_agreement(target_model, head_weight, head_rows, right_padded(held_out, args.max_len, device), autocast)
    print(f"sanity: the target's own restricted argmax matches {sanity:.3f} of held-out labels", flush=True)
    started = time.time()

    def schedule(step: int) -> float:
        progress = max(step / args.steps, (time.time() - started) / (args.minutes * 60))
        return min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    @torch.no_grad()
    def held_out_agreement() -> float:
        draft.eval()
        agree, total = 0.0, 0
        for group in held_batches:
            batch = right_padded(group, args.max_len, device)
            _, batch_agree = online_loss(draft, target_model, head_weight, head_rows, batch, autocast)
            agree += float(batch_agree) * len(batch[3])
            total += len(batch[3])
        draft.train()
        return agree / max(total, 1)

    best, step = -1.0, 0
    history = []
    bar = tqdm(total=args.steps, desc="distil (online)", mininterval=5)
    draft.train()
    while step < args.steps and time.time() - started < args.minutes * 60:
        for group in optimizer.param_groups:
            group["lr"] = args.lr * schedule(step)
        loss, agree = online_loss(draft, target_model, head_weight, head_rows,
                                  right_padded(rng.choice(batches), args.max_len, device), autocast)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        bar.update(1)
        out_of_time = time.time() - started >= args.minutes * 60
        if step % args.eval_every == 0 or step == args.steps or out_of_time:
            held = held_out_agreement()
            history.append((step, round(time.time() - started, 1), round(loss.item(), 4), round(held, 4)))
            print(f"\nstep {step}: loss {loss.item():.3f}, train-batch agreement {agree.item():.3f}, "
                  f"held-out greedy agreement {held:.3f}, {time.time() - started:.0f} s", flush=True)
            if held >= best:
                best = held
                torch.save({"draft": {k: v.detach().cpu() for k, v in draft.state_dict().items()
                                      if "embed" not in k and "lm_head" not in k},
                            "step": step, "head_rows": head_rows.cpu(), "layers_from": layers_from, "config": config,
                            "held_out_agreement": held, "train_seconds": time.time() - started,
                            "answer_tokens": answer_tokens, "answers": len(own), "history": history,
                            "recipe": vars(args)}, work / "draft_best.pt")
    bar.close()


def gpu(args) -> None:
    """The shipped recipe in one command: generate, train --online, export."""
    generate(argparse.Namespace(**{**vars(args), "minutes": args.generate_minutes, "batch": args.generate_batch}))
    train_online(argparse.Namespace(**{**vars(args), "minutes": args.train_minutes, "steps": args.steps}))
    export(args)


def main() -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--work", default=str(DEFAULT_WORK), help="folder for teacher data and checkpoints")
    common.add_argument("--gsm8k-train", default=str(DEFAULT_GSM8K_TRAIN))
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--threads", type=int, default=2)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_teacher = sub.add_parser("teacher", parents=[common])
    p_teacher.add_argument("--gsm8k", type=int, default=700)
    p_teacher.add_argument("--written", type=int, default=500)
    p_teacher.add_argument("--batch", type=int, default=24)
    p_teacher.add_argument("--max-new-tokens", type=int, default=256)
    p_train = sub.add_parser("train", parents=[common])
    p_train.add_argument("--layers-from", default="0,29", help="target blocks the draft blocks start from")
    p_train.add_argument("--head-size", type=int, default=8192)
    p_train.add_argument("--steps", type=int, default=3000)
    p_train.add_argument("--minutes", type=float, default=40.0, help="wall-clock budget; resumable")
    p_train.add_argument("--batch", type=int, default=8)
    p_train.add_argument("--max-len", type=int, default=512)
    p_train.add_argument("--lr", type=float, default=5e-4)
    p_train.add_argument("--eval-every", type=int, default=100)
    p_train.add_argument("--restart", action="store_true")
    p_train.add_argument("--weight-decay", type=float, default=0.01)
    p_train.add_argument("--held-out", type=int, default=24, help="generated answers kept for evaluation")
    p_forced = sub.add_parser("forced", parents=[common])
    p_forced.add_argument("--skip", type=int, default=720, help="GSM8K train questions kept for teacher/dev")
    p_forced.add_argument("--batch", type=int, default=16)
    p_forced.add_argument("--minutes", type=float, default=15.0)
    p_dev = sub.add_parser("devset", parents=[common])
    p_dev.add_argument("--gsm8k", type=int, default=700, help="questions the teacher used")
    p_dev.add_argument("--written", type=int, default=500, help="written prompts the teacher used")
    p_dev.add_argument("--count", type=int, default=20)
    p_export = sub.add_parser("export", parents=[common])
    p_export.add_argument("--out", default=str(EMBEDDED_DRAFT_DIR))
    p_gpu = sub.add_parser("gpu", parents=[common], help="generate + train --online + export (the shipped recipe)")
    p_gpu.add_argument("--device", default="cuda")
    p_gpu.add_argument("--out", default=str(EMBEDDED_DRAFT_DIR))
    p_gpu.add_argument("--batch-generate", dest="generate_batch", type=int, default=1024)
    p_gpu.add_argument("--max-new-tokens", type=int, default=384)
    p_gpu.add_argument("--self-instruct", type=int, default=4096, help="questions the target writes itself")
    p_gpu.add_argument("--limit", type=int, default=0, help="at most this many prompts per source (0: all)")
    p_gpu.add_argument("--generate-minutes", type=float, default=3.0)
    p_gpu.add_argument("--train-minutes", type=float, default=4.0)
    p_gpu.add_argument("--layers-from", default="0,1")
    p_gpu.add_argument("--head-size", type=int, default=8192)
    p_gpu.add_argument("--steps", type=int, default=100_000)
    p_gpu.add_argument("--batch", type=int, default=64, help="training batch (answers)")
    p_gpu.add_argument("--max-len", type=int, default=512)
    p_gpu.add_argument("--lr", type=float, default=1e-3)
    p_gpu.add_argument("--weight-decay", type=float, default=0.01)
    p_gpu.add_argument("--eval-every", type=int, default=250)
    p_gpu.add_argument("--held-out", type=int, default=128, help="generated answers kept for evaluation")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    commands = {"teacher": teacher, "forced": forced, "train": train, "export": export, "devset": devset, "gpu": gpu}
    commands[args.command](args)


if __name__ == "__main__":
    main()
