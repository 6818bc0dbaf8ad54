"""Batched answers from a transformers causal LM, and the file that keeps them: what the draft recipe
(scripts/distill_draft.py) generates its training data with. A group too big for the device's memory
is split in halves rather than ending the run; generated.npz is written whole after every batch.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dropmatch.decoding.causal_lm import stop_token_ids


@torch.inference_mode()
def batched_generate(model, tokenizer, encoded: list[list[int]], *, batch: int, max_new_tokens: int,
                     deadline: float, sample: bool = False, desc: str = "generate"):
    """Yields, batch by batch, [(prompt ids, answer ids up to and including the first stop
    token)] for as many prompts as the deadline allows; batches of similar length, visited in a
    shuffled order so that a cut run still covers short and long prompts."""
    stops = list(stop_token_ids(tokenizer, model))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    encoded = sorted(encoded, key=len)
    batches = [encoded[i : i + batch] for i in range(0, len(encoded), batch)]
    random.Random(len(encoded)).shuffle(batches)
    done = 0
    for group in tqdm(batches, desc=desc):
        if time.time() > deadline:
            print(f"{desc}: deadline reached after {done} of {len(encoded)} prompts", flush=True)
            return
        options = dict(do_sample=True, temperature=0.8, top_p=0.95) if sample else dict(do_sample=False)
        answers = generate_group(model, group, pad, stops, max_new_tokens=max_new_tokens, **options)
        done += len(group)
        yield list(zip(group, answers))


def generate_group(model, group: list[list[int]], pad: int, stops: list[int], **options) -> list[list[int]]:
    """Answers to one batch of prompts (left-padded); a batch too big for the device's memory is
    split in halves rather than ending the run."""
    width = max(len(ids) for ids in group)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in group], device=model.device)
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in group], device=model.device)
    out = None
    try:
        out = model.generate(input_ids=input_ids, attention_mask=attention, eos_token_id=stops, pad_token_id=pad,
                             **options).tolist()
    except torch.OutOfMemoryError:
        if len(group) == 1:
            raise
    if out is None:  # outside the except block, so that the failed attempt's tensors are freed first
        del input_ids, attention
        torch.cuda.empty_cache()
        half = len(group) // 2
        print(f"out of memory with {len(group)} prompts in a batch: halves instead", flush=True)
        return (generate_group(model, group[:half], pad, stops, **options)
                + generate_group(model, group[half:], pad, stops, **options))
    answers = []
    for row in out:
        answer = row[width:]
        answers.append(answer[: next((i + 1 for i, token in enumerate(answer) if token in stops), len(answer))])
    return answers


def load_generated(path: Path) -> tuple[list[dict], list[dict]]:
    """(records, runs) of a generated.npz; ([], []) when there is none yet. A record is
    {"ids": int32 [prompt + answer], "prompt_len": int, "source": where its prompt came from}."""
    if not path.exists():
        return [], []
    data = np.load(path)
    ends = np.cumsum(data["lengths"])
    records = [{"ids": torch.from_numpy(ids.astype(np.int32)), "prompt_len": int(prompt_len), "source": str(source)}
               for ids, prompt_len, source in zip(np.split(data["ids"], ends[:-1]), data["prompt_lens"], data["sources"])]
    return records, json.loads(str(data["runs"]))


def save_generated(path: Path, records: list[dict], runs: list[dict]) -> None:
    """Written whole after every batch (to a temporary name first), so a cut run loses one batch at most."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.stem + ".partial.npz")
    np.savez_compressed(partial, ids=np.concatenate([r["ids"].numpy() for r in records]).astype(np.int32),
                        lengths=np.array([len(r["ids"]) for r in records]),
                        prompt_lens=np.array([r["prompt_len"] for r in records]),
                        sources=np.array([r["source"] for r in records]), runs=np.array(json.dumps(runs)))
    partial.replace(path)
