"""What one serving step's re-verification costs on this machine, apart from any server: verify_greedy
(serving/verify.py) with the plugin's VllmHead over a batch of greedy requests, on a random LM head
of the embedded target's shape (V 49152, H 576), one thread as vLLM's CPU worker runs. Each request
drafts gamma tokens, the first 0, 1 or 2 of them the target's own choice; the draft's logits are
random rows.

    .venv/bin/python scripts/judge_step_cost.py [--requests 16] [--p 0,0.15] [--steps 10]

Prints the milliseconds a step (the median of --steps) at each p. glibc's allocator returns large
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

from dropmatch.config import RuleConfig  # noqa: E402
from dropmatch.serving.verify import Round, verify_greedy  # noqa: E402
from dropmatch.serving.vllm.runner import VllmHead  # noqa: E402  (imports no vLLM)


class RandomLM:
    """What VllmHead reads of a vLLM model: compute_logits, here over a random LM head weight [V, H]."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weight.T


def rounds_of(model: RandomLM, requests: int, gamma: int, generator: torch.Generator) -> list[Round]:
    """Rounds as a server hands them over: views of the step's rows, the server's own verdict given."""
    vocab, hidden_size = model.weight.shape
    made = []
    for i in range(requests):
        hidden = torch.randn(gamma + 1, hidden_size, generator=generator)
        logits = model.compute_logits(hidden)
        target = logits.argmax(-1)
        drafts = torch.randint(0, vocab, (gamma,), generator=generator)
        drafts[: i % 3] = target[: i % 3]
        accepted = int((drafts == target[:gamma]).int().cumprod(0).sum())
        draft_logits = tuple(torch.randn(gamma, vocab, generator=generator))
        made.append(Round(100 + i, drafts, draft_logits, hidden, logits, 1234 + i,
                          lossless=(accepted, int(target[accepted]))))
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
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    model = RandomLM(torch.randn(args.vocab, args.hidden, generator=generator) * 0.05)
    head = VllmHead(model)  # the plugin's own head: path rows through compute_logits, as in vLLM
    rounds = rounds_of(model, args.requests, args.gamma, generator)
    for p in (float(text) for text in args.p.split(",")):
        rule = RuleConfig("dropmatch", p=p)
        verify_greedy(head, rule, rounds)  # first-call costs out of the timing
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            verify_greedy(head, rule, rounds)
            times.append(1000 * (time.perf_counter() - start))
        print(f"p {p:g}: {statistics.median(times):.1f} ms a step of {args.requests} requests "
              f"({min(times):.1f}-{max(times):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
