"""Where a round's time goes: milliseconds and aten ops per phase of lossless SD's and DropMatch's rounds
on the embedded pair, at the Studio's defaults (docs/results.md, "Where a round's time goes").

    .venv/bin/python scripts/round_profile.py [--prompts 6] [--tokens 96] [--p 0.3]

Each phase is the outermost engine call it names (a phase inside another counts to the outer one); "the
round's own code" is the rest of the round (Python, dispatch, bookkeeping between the phases). Times come
from a pass without op counting; op counts from a second pass under a TorchDispatchMode that counts every
aten op a phase dispatches (on a GPU each is a kernel launch: the figure a GPU backend pays).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dropmatch.decoding import drafting, engine as engine_module
from dropmatch.decoding.config import DEFAULTS
from dropmatch.decoding.engine import Engine, run_to_end
from dropmatch.models import load_embedded_pair
from dropmatch.decoding.causal_lm import CausalLM
from tools.dev_set import DEV_PROMPTS

PHASES = {  # phase -> (owner, attribute) of the calls it times
    "draft": [(drafting.HybridDrafter, "propose"), (drafting.ModelDrafter, "propose"), (drafting.LookupDrafter, "propose")],
    "target forward": [(CausalLM, "hidden")],
    "clean head": [(CausalLM, "logits")],
    "verify step": [(Engine, "_decide")],
    "commit and crop": [(Engine, "_commit"), (CausalLM, "crop"), (drafting.HybridDrafter, "learn")],
    "recording": [(engine_module, name) for name in ("to_host", "top_tokens", "drafted_records", "emitted_view")],
    "round": [(Engine, "_round")],
}


class Tally:
    """Seconds and aten ops per phase; the outermost active phase owns what runs inside it."""

    def __init__(self):
        self.seconds, self.ops, self.active = Counter(), Counter(), []

    def wrap(self, phase: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            # Counted only inside a round (prefill and gamma = auto's step costs are not a round's), and
            # only at the outermost phase: the draft model's own hidden() belongs to "draft".
            counted = phase == "round" or self.active[-1:] == ["round"]
            self.active.append(phase if counted or not self.active else self.active[-1])
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if counted:
                    self.seconds[phase] += time.perf_counter() - start
                self.active.pop()
        return timed


class OpCounter(TorchDispatchMode):
    def __init__(self, tally: Tally):
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        active = self.tally.active
        self.tally.ops[active[-1] if "round" in active else "outside rounds"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def instrumented(tally: Tally):
    saved = []
    for phase, targets in PHASES.items():
        for owner, name in targets:
            raw = vars(owner)[name]  # as defined: a staticmethod stays one when restored
            saved.append((owner, name, raw))
            wrapped = tally.wrap(phase, getattr(owner, name))
            setattr(owner, name, staticmethod(wrapped) if isinstance(raw, staticmethod) else wrapped)
    try:
        yield
    finally:
        for owner, name, raw in reversed(saved):
            setattr(owner, name, raw)


def profile(engine: Engine, prompts: list[str], tokens: int, rule_name: str, p: float, count_ops: bool) -> tuple[Tally, int]:
    decode, rule = DEFAULTS.replace(rule=rule_name, max_new_tokens=tokens, **({"p": p} if rule_name != "lossless" else {}),
                                    prompt="x").parse()
    tally, rounds = Tally(), 0
    with instrumented(tally), (OpCounter(tally) if count_ops else contextlib.nullcontext()):
        for prompt in prompts:
            trace = run_to_end(engine.speculative(engine.encode(prompt), decode, rule))
            rounds += len(trace.rounds)
    return tally, rounds


def table(engine: Engine, prompts: list[str], tokens: int, p: float) -> str:
    lines = ["| phase | " + " | ".join(f"{r} ms/round | {r} aten ops/round" for r in ("lossless SD", "DropMatch")) + " |",
             "|---|" + "---:|" * 4]
    results = {}
    for rule in ("lossless", "dropmatch"):
        profile(engine, prompts[:1], 16, rule, p, count_ops=False)  # warm-up
        timed, rounds = profile(engine, prompts, tokens, rule, p, count_ops=False)
        counted, counted_rounds = profile(engine, prompts, tokens, rule, p, count_ops=True)
        results[rule] = (timed, rounds, counted, counted_rounds)
    for phase in [*list(PHASES)[:-1], "the round's own code", "round"]:
        cells = []
        for rule in ("lossless", "dropmatch"):
            timed, rounds, counted, counted_rounds = results[rule]
            inner = sum(timed.seconds[k] for k in list(PHASES)[:-1])
            seconds = timed.seconds["round"] - inner if phase == "the round's own code" else timed.seconds[phase]
            ops = counted.ops["round"] if phase == "the round's own code" else (
                sum(counted.ops.values()) - counted.ops["outside rounds"] if phase == "round" else counted.ops[phase])
            cells += [f"{1000 * seconds / rounds:.1f}", f"{ops / counted_rounds:.0f}"]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n{len(prompts)} dev prompts, {tokens} tokens, rounds: " + ", ".join(
        f"{rule} {results[rule][1]}" for rule in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--p", type=float, default=0.3, help="DropMatch's dropout rate (the paper's 0.3)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine(load_embedded_pair(torch.device("cpu")))
    print(f"kernels: {engine.services.kernels}")
    print(table(engine, DEV_PROMPTS[: args.prompts], args.tokens, args.p))


if __name__ == "__main__":
    main()
