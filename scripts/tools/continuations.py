"""Many greedy continuations of the target at once, each from its own cached prefix: the batched
work behind mining a trained judge's labels (mining.py, scripts/mine_judge.py).

A prefix is the key/value rows the target computed for it ([(keys [1, heads, L, d], values) per
layer], read with `prefix_rows`). `greedy_continuations` left-pads the prefixes' rows into one
cache, feeds each job's next token at its own position and decodes greedily, every row in one
forward per step, until each row hits a stop token or its own budget. Padding changes a matmul's
shape, so a row's logits can differ from a batch-of-one run in the last bits; a near tie can then
continue otherwise (mining measures how often with its control jobs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dropmatch.decoding.causal_lm import CausalLM

Rows = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys [1, heads, L, d], values [1, heads, L, d])


@dataclass(frozen=True)
class Job:
    """Continue after `past` (the rows of L tokens already read) by reading `token` at position L,
    then at most `budget` greedy tokens (0: read the token only)."""

    past: Rows
    token: int
    budget: int

    @property
    def past_length(self) -> int:
        return int(self.past[0][0].shape[2])


@dataclass(frozen=True)
class Continuation:
    """tokens: the greedy tokens after the job's token (a stop token, when one came, last);
    hidden [H]: the target's final hidden state on reading the job's token; rows: the rows of the
    past, the job's token and every generated token but the last (what a later job may crop)."""

    tokens: list[int]
    hidden: torch.Tensor
    rows: Rows


@torch.inference_mode()
def prefix_rows(target: CausalLM, ids: list[int]) -> Rows:
    """The target's key/value rows for reading ids [L] from an empty cache (batch of one)."""
    cache = target.new_cache()
    target.hidden(torch.tensor(ids, dtype=torch.long, device=target.device), cache)
    return [(layer.keys, layer.values) for layer in cache.layers]


def crop_rows(rows: Rows, length: int) -> Rows:
    """The first `length` positions of some rows (views)."""
    return [(keys[:, :, :length], values[:, :, :length]) for keys, values in rows]


@torch.inference_mode()
def greedy_continuations(target: CausalLM, jobs: list[Job], stop_ids: frozenset[int]) -> list[Continuation]:
    """Each job's greedy continuation, all jobs decoded together (see the module's docstring)."""
    from transformers import DynamicCache

    lengths = [job.past_length for job in jobs]
    width = max(lengths)
    cache = DynamicCache(ddp_cache_data=_left_padded(jobs, width), config=target.model.config)
    mask = torch.zeros(len(jobs), width, dtype=torch.long, device=target.device)
    for row, length in enumerate(lengths):
        mask[row, width - length:] = 1
    tokens = torch.tensor([[job.token] for job in jobs], device=target.device)
    positions = torch.tensor([[length] for length in lengths], device=target.device)
    generated: list[list[int]] = [[] for _ in jobs]
    done = [job.budget == 0 or job.token in stop_ids for job in jobs]
    first_hidden = None
    while True:
        mask = torch.cat([mask, mask.new_ones(len(jobs), 1)], 1)
        out = target.decoder(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                             **{target.cache_name: cache})
        hidden = out.last_hidden_state[:, -1]
        first_hidden = hidden if first_hidden is None else first_hidden
        if all(done):
            break
        chosen = target.logits(hidden).argmax(-1)
        for row, token in enumerate(chosen.tolist()):
            if not done[row]:
                generated[row].append(token)
                done[row] = token in stop_ids or len(generated[row]) >= jobs[row].budget
        if all(done):
            break
        tokens, positions = chosen.view(-1, 1), positions + 1
    return [Continuation(generated[row], first_hidden[row].clone(), _row(cache, row, width - lengths[row],
                                                                          width + max(len(generated[row]), 1)))
            for row in range(len(jobs))]


def _left_padded(jobs: list[Job], width: int) -> Rows:
    layers = []
    for layer in range(len(jobs[0].past)):
        keys, values = [], []
        for job in jobs:
            job_keys, job_values = job.past[layer]
            pad = width - job_keys.shape[2]
            keys.append(torch.nn.functional.pad(job_keys, (0, 0, pad, 0)))
            values.append(torch.nn.functional.pad(job_values, (0, 0, pad, 0)))
        layers.append((torch.cat(keys), torch.cat(values)))
    return layers


def _row(cache, row: int, start: int, end: int) -> Rows:
    """One row's rows without its left padding: positions start..end of the batched cache, copied."""
    return [(layer.keys[row : row + 1, :, start:end].clone(), layer.values[row : row + 1, :, start:end].clone())
            for layer in cache.layers]
