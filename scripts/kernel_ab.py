"""A/B of the CPU kernel choice: the engine's lossless SD with the kernels measured at load against the same
engine with them pinned to torch's default (DROPMATCH_CPU_KERNELS=torch), alternating, on the written dev prompts.

    OMP_NUM_THREADS=1 python scripts/kernel_ab.py [--prompts 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

from dropmatch.decoding.config import Settings
from dropmatch.decoding.engine import Engine, run_to_end
from dropmatch.models import load_embedded_pair
from tools.dev_set import DEV_PROMPTS


def engines() -> dict[str, Engine]:
    """One engine per kernel choice: measured at load, and pinned to torch's default."""
    found = {}
    for name in ("measured", "torch"):
        os.environ.pop("DROPMATCH_CPU_KERNELS", None)
        if name == "torch":
            os.environ["DROPMATCH_CPU_KERNELS"] = "torch"
        found[name] = Engine(load_embedded_pair())
    os.environ.pop("DROPMATCH_CPU_KERNELS", None)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    pair = engines()
    speeds = {name: [] for name in pair}
    for prompt in DEV_PROMPTS[: args.prompts]:
        decode, rule = Settings(prompt).parse()
        rule = dataclasses.replace(rule, rule="lossless")
        for run in range(args.runs):
            order = list(pair.items()) if run % 2 == 0 else list(reversed(pair.items()))
            for name, engine in order:
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
