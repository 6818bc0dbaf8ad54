"""A/B of the CPU kernel choice: the engine's lossless SD with the kernels measured at load against the same
engine inside cpu_kernels.torch_default_kernels (torch's default, as a user's plain model runs), alternating, on
the written dev prompts.

    OMP_NUM_THREADS=1 python scripts/kernel_ab.py [--prompts 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import time

import torch

from dropmatch.decoding.config import Settings
from dropmatch.decoding.cpu_kernels import torch_default_kernels
from dropmatch.decoding.engine import Engine, run_to_end
from dropmatch.models import load_embedded_pair
from tools.dev_set import DEV_PROMPTS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    engine = Engine(load_embedded_pair())
    kernels = {"measured": contextlib.nullcontext,
               "torch": lambda: torch_default_kernels(engine.target.model, engine.draft.model)}
    speeds = {name: [] for name in kernels}
    for prompt in DEV_PROMPTS[: args.prompts]:
        decode, rule = Settings(prompt).parse()
        rule = dataclasses.replace(rule, rule="lossless")
        for run in range(args.runs):
            for name in (kernels if run % 2 == 0 else reversed(kernels)):
                with kernels[name]():
                    start = time.perf_counter()
                    trace = run_to_end(engine.speculative(engine.encode(prompt), decode, rule))
                    speeds[name].append(len(trace.output_ids) / (time.perf_counter() - start))
    ratios = [a / b for a, b in zip(speeds["measured"], speeds["torch"])]
    for name, values in speeds.items():
        print(f"{name:9s} tokens/s: {' '.join(f'{v:.1f}' for v in values)}")
    print(f"measured / torch per run: {min(ratios):.2f}-{max(ratios):.2f}, median {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
