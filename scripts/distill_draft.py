"""Recipe of the shipped draft (assets/draft): the target's own answers -> distillation -> export.

The shipped draft was made on one CUDA GPU (an H200) in two sessions, sharing one --work folder
(budgets are wall-clock minutes; generation resumes where the folder's generated.npz left off):

    # session 1 (only its answers are kept): fp32, batches of 1,024, 2.75 minutes -> 5,120 answers
    python scripts/distill_draft.py generate --device cuda --generate-dtype float32 --batch-generate 1024 \
        --self-instruct 4096 --generate-minutes 2.75
    # session 2 (461 s): bf16, batches of 2,048, 3 minutes -> 10,240 more answers; 3.5 minutes of training
    python scripts/distill_draft.py gpu --device cuda

which runs, in one process:
  generate  greedy target answers (token ids) to GSM8K *train* questions, prompts written from the
            templates below and questions the target writes itself about the listed topics
            (self-instruct, sampled with seed + the number of earlier runs), in batches of similar
            length visited in a shuffled order, until its time budget ends; saved after every batch
            to WORK/generated.npz, and a later run skips the prompts answered there;
  train     distillation of the small draft against the target's distributions over the draft's
            head rows, computed live from the target (no stored logits), with a held-out check;
  export    the best held-out checkpoint -> assets/draft/{config.json,draft.safetensors,recipe.json}
`--device cpu` runs the same recipe without a GPU (about 100 times slower). Never trained on: the
GSM8K test set, HumanEval, MT-Bench or IFEval (what the draft is evaluated on).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from dropmatch.models import EMBEDDED_DRAFT_DIR, load_embedded_target
from dropmatch.decoding.causal_lm import encode_prompt, stop_token_ids
from tools.dev_set import DEFAULT_GSM8K_TRAIN, DEV_GSM8K, DEV_PROMPTS, gsm8k_questions  # noqa: F401
from tools.generation import batched_generate, load_generated, save_generated

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_WORK = ROOT / "runs" / "distill"

TOPICS = [
    "the ocean", "autumn leaves", "a city at night", "friendship", "learning to code", "coffee",
    "space exploration", "a lost cat", "climate change", "the first day of school", "mountains",
    "electric cars", "a rainy afternoon", "honey bees", "the internet", "a small bakery",
    "volcanoes", "chess", "a train journey", "recycling", "the moon", "music festivals",
    "a grandmother's garden", "robots", "healthy breakfasts", "the Roman Empire", "photosynthesis",
    "remote work", "a thunderstorm", "solar panels", "libraries", "a job interview",
    "the human heart", "bicycles", "time management", "dinosaurs", "the stock market",
    "social media", "a camping trip", "vaccines", "the printing press", "public speaking",
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
TEMPLATES = [
    "Write a short poem about {t}.", "Write a short story about {t}.",
    "Write a blog post about {t}.", "Write a friendly email to a colleague about {t}.",
    "Explain {t} in simple terms.", "What are the pros and cons of {t}?",
    "Give me five tips related to {t}.", "Summarize what people should know about {t}.",
    "Describe {t} to a ten-year-old.", "Write a persuasive paragraph about {t}.",
    "List three interesting facts about {t}.", "Write a haiku about {t}.",
    "Write a dialogue between two friends about {t}.", "Write a tweet about {t}.",
    "Why is {t} important?", "Compare {t} and {u}.",
    "Write a travel blog post about {t}.", "Draft a professional email about {t}.",
    "Write a product description related to {t}.", "Write an opening paragraph for a novel about {t}.",
    "Explain the main ideas behind {t} step by step.", "What are common misconceptions about {t}?",
    "Write a short speech about {t}.", "Create a lesson plan for teaching {t}.",
    "Give a balanced argument for and against {t}.", "How would you explain {t} to a beginner?",
    "Write a limerick about {t}.", "Write a news headline and a short article about {t}.",
    "Describe a typical day that involves {t}.", "What questions should I ask an expert on {t}?",
    "Write a short review of a book about {t}.", "Outline an essay on {t}.",
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


def devset(args) -> None:
    """Held-out development prompts for tuning gamma and p = auto's agreement, never trained on
    and never the evaluation sets: GSM8K train questions that `generate` skips, interleaved with
    DEV_PROMPTS (so that --limit N takes both kinds)."""
    questions = gsm8k_questions(args.seed, args.gsm8k_train)
    pairs = zip(questions[DEV_GSM8K][: args.count], DEV_PROMPTS[: args.count])
    out = Path(args.work) / "dev.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"prompt": prompt}) for pair in pairs for prompt in pair]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(lines)} prompts")


# ---------------------------------------------------------------- training


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


def export(args) -> None:
    from safetensors.torch import save_file

    ckpt = torch.load(Path(args.work) / args.checkpoint)  # the best held-out agreement, not merely the last step
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.to(torch.float16).contiguous() for name, tensor in ckpt["draft"].items()}
    tensors["head_rows"] = ckpt["head_rows"].to(torch.int32)
    save_file(tensors, str(out / "draft.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(ckpt["config"], indent=2))
    recipe = {k: ckpt[k] for k in ("step", "layers_from", "held_out_agreement", "train_seconds", "answer_tokens")}
    recipe["head_rows"] = int(ckpt["head_rows"].numel())
    recipe.update({k: ckpt[k] for k in ("answers", "history", "generation", "recipe", "held_out_agreement_per_depth")
                   if k in ckpt})
    (out / "recipe.json").write_text(json.dumps(recipe, indent=2, default=str))
    print(f"wrote {out}: {recipe}")


# ---------------------------------------------------------------- prompts of the recipe

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


def written_prompts(seed: int) -> list[str]:
    """Template prompts of the recipe: every template x topic, roles, code tasks; shuffled."""
    rng = random.Random(seed)
    prompts = []
    for template in TEMPLATES:
        for topic in TOPICS:
            prompts.append(template.format(t=topic, u=rng.choice([t for t in TOPICS if t != topic])))
    for role in ROLES:
        for topic in rng.sample(TOPICS, 12):
            prompts.append(f"Pretend you are {role}. Tell me about {topic}.")
    for task in CODE_TASKS:
        prompts.append(f"Write a Python function that {task}.")
        prompts.append(f"Write a Python function that {task}, with a docstring and an example.")
        prompts.append(f"Explain how to write a program that {task}, then show the code.")
    rng.shuffle(prompts)
    return prompts


def self_instruct(model, tokenizer, count: int, seed: int, batch: int, deadline: float) -> list[str]:
    """Questions the target writes itself about listed topics (sampled), as extra training prompts."""
    rng = random.Random(seed)
    asks = [f"Write {rng.choice(QUESTION_KINDS)} that a user might ask an AI assistant about {rng.choice(TOPICS)}. "
            "Reply with the question only." for _ in range(count)]
    questions = set()
    for pairs in batched_generate(model, tokenizer, [encode_prompt(tokenizer, a) for a in asks], batch=batch,
                                  max_new_tokens=64, deadline=deadline, sample=True, desc="self-instruct"):
        for _, answer in pairs:
            text = tokenizer.decode(answer, skip_special_tokens=True).strip().strip('"').split("\n")[0].strip()
            if 15 <= len(text) <= 300:
                questions.add(text)
    return sorted(questions)


SOURCES = ("gsm8k", "written", "self")


def shuffled_answers(records: list[dict], rng: random.Random) -> list[dict]:
    """The records that have an answer, in rng's shuffled order. `train` holds out the first ones;
    one seeded order, so that every run holds out the same answers."""
    answered = [r for r in records if len(r["ids"]) > r["prompt_len"]]
    rng.shuffle(answered)
    return answered


def generation_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def generate(args) -> float:
    """Greedy target answers (token ids only) to GSM8K train questions, template prompts and
    self-instruct questions, within a time budget. Resumable: answers already in WORK/generated.npz
    are kept and their prompts skipped; each run is logged in the file. Returns the seconds of the
    budget left unused (when every prompt was answered before it ended)."""
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    started = time.time()
    dtype = generation_dtype(args.generate_dtype, device)
    model, tokenizer, _ = load_embedded_target(device, dtype)
    loaded = time.time()  # the budget counts generation only, not the one-time GGUF conversion
    deadline = budget_end(loaded, args.minutes)
    path = Path(args.work) / "generated.npz"
    records, runs = load_generated(path)
    answered = {tuple(r["ids"][: r["prompt_len"]].tolist()) for r in records}
    if records:
        print(f"resuming: {len(records)} answers from {len(runs)} earlier run(s) in {path}", flush=True)
    questions = gsm8k_questions(args.seed, args.gsm8k_train)
    questions = questions[: DEV_GSM8K.start] + questions[DEV_GSM8K.stop :]  # the dev set's are never trained on
    written = written_prompts(args.seed)
    asked = self_instruct(model, tokenizer, args.self_instruct, args.seed + len(runs), args.batch,
                          budget_end(loaded, args.minutes * 0.15)) if args.self_instruct else []
    print(f"prompts: {len(questions)} GSM8K train, {len(written)} written, {len(asked)} self-instruct, "
          f"for example {random.Random(args.seed).sample(asked, min(3, len(asked)))}", flush=True)
    sources = {}
    for source, prompts in zip(SOURCES, (questions, written, asked)):
        for prompt in prompts[: args.limit or None]:
            sources.setdefault(tuple(encode_prompt(tokenizer, prompt)), source)
    todo = [list(k) for k in sources if k not in answered]
    run = {"dtype": str(dtype).removeprefix("torch."), "device": device.type, "minutes": args.minutes,
           "max_new_tokens": args.max_new_tokens, "prompts_left": len(todo), "answers": 0, "answer_tokens": 0}
    runs.append(run)
    for pairs in batched_generate(model, tokenizer, todo, batch=args.batch, max_new_tokens=args.max_new_tokens,
                                  deadline=deadline, desc="answers"):
        new = [{"ids": torch.tensor(prompt + answer, dtype=torch.int32), "prompt_len": len(prompt),
                "source": sources[tuple(prompt)]} for prompt, answer in pairs if answer]
        records += new
        run["answers"] += len(new)
        run["answer_tokens"] += sum(len(r["ids"]) - r["prompt_len"] for r in new)
        run["seconds"] = round(time.time() - started)
        save_generated(path, records, runs)
    counts = {s: sum(r["source"] == s for r in records) for s in SOURCES}
    print(f"generated {run['answers']} answers ({run['answer_tokens']} answer tokens) in {time.time() - started:.0f} s; "
          f"{path} now holds {len(records)} answers {counts}", flush=True)
    return max(0.0, deadline - time.time()) if math.isfinite(deadline) else 0.0


def budget_end(start: float, minutes: float) -> float:
    """When a budget of `minutes` from `start` ends; a budget of 0 minutes never ends (the counts,
    --limit, --self-instruct and --steps, bound the work instead: what a test gives)."""
    return start + minutes * 60 if minutes > 0 else math.inf


def budget_used(start: float, minutes: float) -> float:
    """The share of a time budget used so far (0 for a budget of 0 minutes, which never ends)."""
    return (time.time() - start) / (minutes * 60) if minutes > 0 else 0.0


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


def optimizer_step(optimizer, loss: torch.Tensor, params, max_norm: float = 1.0) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    optimizer.step()


def time_to_evaluate(step: int, args, started: float) -> bool:
    """Every args.eval_every steps, at the last step, and when the time budget has run out."""
    return step % args.eval_every == 0 or step == args.steps or budget_used(started, args.minutes) >= 1


def batched(records: list, size: int) -> list[list]:
    return [records[i : i + size] for i in range(0, len(records), size)]


def check_enough_answers(records: list, runs: list[dict], held_out: int, path: Path) -> None:
    """Ends the script with one line when training cannot start: no held-out answer, or none left over."""
    if held_out < 1:
        raise SystemExit("error: --held-out must be at least 1 (the best checkpoint is chosen on held-out answers)")
    if len(records) <= held_out:
        budget = f"after {round(sum(run.get('seconds', 0) for run in runs))} s of generation"
        raise SystemExit(f"error: {len(records)} answers in {path} {budget}, and --held-out keeps {held_out}: "
                         "none left to train on; raise --generate-minutes (or --limit)")


def split_held_out(records: list, count: int) -> tuple[list, list]:
    """(the first `count` records, held out; the rest, trained on)."""
    return records[:count], records[count:]


@torch.no_grad()
def held_out_agreement(draft, target_model, head_weight, head_rows, held_batches, max_len, device, autocast) -> float:
    """The draft's greedy agreement with the target on the held-out answers (the model stays in train mode after)."""
    draft.eval()
    agree, total = 0.0, 0
    for group in held_batches:
        batch = right_padded(group, max_len, device)
        _, batch_agree = online_loss(draft, target_model, head_weight, head_rows, batch, autocast)
        agree += float(batch_agree) * len(batch[3])
        total += len(batch[3])
    draft.train()
    return agree / max(total, 1)


def train(args) -> None:
    """Distil the draft against the target's live distributions on WORK/generated.npz."""
    torch.manual_seed(args.seed)
    device, work = torch.device(args.device), Path(args.work)
    autocast = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = autocast
    records, generation_runs = load_generated(work / "generated.npz")
    check_enough_answers(records, generation_runs, args.held_out, work / "generated.npz")
    target_model, tokenizer, _ = load_embedded_target(device, torch.float32)
    target_model.requires_grad_(False)
    rng = random.Random(args.seed)
    held_out, own = split_held_out(shuffled_answers(records, rng), args.held_out)
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
    batches, held_batches = batched(own, args.batch), batched(held_out, args.batch)
    sanity = target_agreement(target_model, head_weight, head_rows, right_padded(held_out, args.max_len, device), autocast)
    print(f"sanity: the target's own restricted argmax matches {sanity:.3f} of held-out labels", flush=True)
    started = time.time()

    def schedule(step: int) -> float:
        progress = max(step / args.steps, budget_used(started, args.minutes))
        return min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    best, step, history = -1.0, 0, []
    bar = tqdm(total=args.steps, desc="distil (online)", mininterval=5)
    draft.train()
    while step < args.steps and budget_used(started, args.minutes) < 1:
        for group in optimizer.param_groups:
            group["lr"] = args.lr * schedule(step)
        loss, agree = online_loss(draft, target_model, head_weight, head_rows,
                                  right_padded(rng.choice(batches), args.max_len, device), autocast)
        optimizer_step(optimizer, loss, params)
        step += 1
        bar.update(1)
        if time_to_evaluate(step, args, started):
            held = held_out_agreement(draft, target_model, head_weight, head_rows, held_batches, args.max_len,
                                      device, autocast)
            history.append((step, round(time.time() - started, 1), round(loss.item(), 4), round(held, 4)))
            print(f"\nstep {step}: loss {loss.item():.3f}, train-batch agreement {agree.item():.3f}, "
                  f"held-out greedy agreement {held:.3f}, {time.time() - started:.0f} s", flush=True)
            if held >= best:
                best = held
                torch.save({"draft": {k: v.detach().cpu() for k, v in draft.state_dict().items()
                                      if "embed" not in k and "lm_head" not in k},
                            "step": step, "head_rows": head_rows.cpu(), "layers_from": layers_from,
                            "config": draft_config(target_model.config.to_dict(), len(layers_from)),
                            "held_out_agreement": held, "train_seconds": time.time() - started,
                            "answer_tokens": answer_tokens, "answers": len(own), "history": history,
                            "generation": generation_runs, "recipe": vars(args)}, work / "draft_best.pt")
    bar.close()


def gpu(args) -> None:
    """The shipped recipe in one command: generate, train, export. Generation time left over
    (every prompt answered before its budget ended) goes to training."""
    unused = generate(argparse.Namespace(**{**vars(args), "minutes": args.generate_minutes, "batch": args.generate_batch}))
    minutes = args.train_minutes + unused / 60 if args.train_minutes > 0 else 0.0
    if unused > 0:
        print(f"every prompt answered with {unused:.0f} s of the generation budget left: training for {minutes:.2f} minutes")
    train(argparse.Namespace(**{**vars(args), "minutes": minutes}))
    export(argparse.Namespace(**{**vars(args), "checkpoint": "draft_best.pt"}))


def main() -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--work", default=str(DEFAULT_WORK), help="folder for the generated answers and checkpoints")
    common.add_argument("--gsm8k-train", default=str(DEFAULT_GSM8K_TRAIN))
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--threads", type=int, default=2)
    common.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    common.add_argument("--out", default=str(EMBEDDED_DRAFT_DIR), help="where export writes the draft")
    generating = argparse.ArgumentParser(add_help=False)
    generating.add_argument("--batch-generate", dest="generate_batch", type=int, default=2048)
    generating.add_argument("--max-new-tokens", type=int, default=384)
    generating.add_argument("--self-instruct", type=int, default=12288, help="questions the target is asked to write")
    generating.add_argument("--limit", type=int, default=0, help="at most this many prompts per source (0: all)")
    generating.add_argument("--generate-minutes", type=float, default=3.0,
                            help="time budget of generation (self-instruct gets 15%% of it); 0: none, the counts bound it")
    generating.add_argument("--generate-dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                            help="auto: bfloat16 on a GPU, float32 on the CPU")
    training = argparse.ArgumentParser(add_help=False)
    training.add_argument("--train-minutes", type=float, default=3.5, help="time budget of training; 0: none, --steps bounds it")
    training.add_argument("--layers-from", default="0,1", help="target blocks the draft blocks start from")
    training.add_argument("--head-size", type=int, default=8192)
    training.add_argument("--steps", type=int, default=100_000, help="at most; the time budget usually ends first")
    training.add_argument("--batch", type=int, default=64, help="answers per training step")
    training.add_argument("--max-len", type=int, default=512)
    training.add_argument("--lr", type=float, default=1e-3)
    training.add_argument("--weight-decay", type=float, default=0.01)
    training.add_argument("--eval-every", type=int, default=250)
    training.add_argument("--held-out", type=int, default=256, help="generated answers kept for evaluation")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("generate", parents=[common, generating])
    sub.add_parser("train", parents=[common, training])
    p_export = sub.add_parser("export", parents=[common])
    p_export.add_argument("--checkpoint", default="draft_best.pt",
                          help="in WORK: the checkpoint to export (train writes draft_best.pt)")
    sub.add_parser("gpu", parents=[common, generating, training], help="generate + train + export (the shipped recipe)")
    p_dev = sub.add_parser("devset", parents=[common])
    p_dev.add_argument("--count", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.command == "generate":
        args = argparse.Namespace(**{**vars(args), "minutes": args.generate_minutes, "batch": args.generate_batch})
    if args.command == "train":
        args = argparse.Namespace(**{**vars(args), "minutes": args.train_minutes})
    commands = {"generate": generate, "train": train, "export": export, "devset": devset, "gpu": gpu}
    commands[args.command](args)


if __name__ == "__main__":
    main()
