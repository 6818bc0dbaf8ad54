"""What one verify step costs on this machine, staged and in one pass, apart from any server:
verifying.verify (through serving/verify.verify_rounds) with the plugin's VllmHead over a batch of greedy
requests (--requests 1: the engine's batch of one), on a random LM head
of the embedded target's shape (V 49152, H 576), one thread as vLLM's CPU worker runs. Each request
drafts gamma tokens, the first 0, 1 or 2 of them the target's own choice; the draft's logits are
random rows.

    .venv/bin/python scripts/verify_step_cost.py [--requests 16] [--p 0,0.15] [--steps 10] [--device cuda]

Prints the milliseconds a step (the median of --steps) at each p, staged (the paths only where the rule
reads them) and in one pass (the paths at every drafted position), with the head rows each computed. glibc's allocator returns large
freed blocks to the system, and the page faults of fresh vocabulary-sized tensors are a good part of
the cost; MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ (or tcmalloc) change that, as they do for vLLM.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dropmatch.decoding.config import RuleConfig  # noqa: E402
from dropmatch.decoding.server_rounds import Round, verify_rounds  # noqa: E402
from dropmatch.serving.vllm.runner import VllmHead  # noqa: E402  (imports no vLLM)


class RandomLM:
    """What VllmHead reads of a vLLM model: compute_logits, here over a random LM head weight [V, H]."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weight.T


def rounds_of(model: RandomLM, requests: int, gamma: int, generator: torch.Generator) -> list[Round]:
    """Rounds as a server hands them over: views of the step's rows, on the head's device."""
    vocab, hidden_size = model.weight.shape
    device = model.weight.device
    made = []
    for i in range(requests):
        hidden = torch.randn(gamma + 1, hidden_size, generator=generator).to(device, model.weight.dtype)
        logits = model.compute_logits(hidden)
        target = logits.argmax(-1)
        drafts = torch.randint(0, vocab, (gamma,), generator=generator).to(device)
        drafts[: i % 3] = target[: i % 3]
        draft_logits = tuple(torch.randn(gamma, vocab, generator=generator).to(device))
        made.append(Round(100 + i, drafts, draft_logits, hidden, logits, 1234 + i))
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--p", default="0,0.15", help="dropout rates, comma-separated")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (the head in bf16 there, as vLLM serves it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, generator=generator) * 0.05
    device = torch.device(args.device)
    model = RandomLM(weight.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32))
    head = VllmHead(model)  # the plugin's own head: path rows through compute_logits, as in vLLM
    rounds = rounds_of(model, args.requests, args.gamma, generator)
    for p in (float(text) for text in args.p.split(",")):
        rule = RuleConfig("dropmatch", p=p)
        for one_pass in (False, True):
            rows = sum(found.path_rows for found in verify_rounds(head, rule, rounds, one_pass))  # first-call costs out
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                verify_rounds(head, rule, rounds, one_pass)
                if device.type == "cuda":
                    torch.cuda.synchronize()  # the step's last kernels are in its time
                times.append(1000 * (time.perf_counter() - start))
            print(f"p {p:g} {'one pass' if one_pass else 'staged  '}: {statistics.median(times):.1f} ms a step of "
                  f"{args.requests} requests ({min(times):.1f}-{max(times):.1f}), {rows} path rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
