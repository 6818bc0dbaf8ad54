"""Can a whole step's dropout masks be drawn in one vectorised op and stay today's masks bit for bit?

Today (mc_head.keyed_masks) each drafted position seeds a torch CPU generator with its key and draws
torch.bernoulli over [K, 1, H]: the first K x H outputs of MT19937 (init_genrand with the key's low 32 bits),
each compared as (output & 0xffffff) / 2**24 < 1 - p. This script re-implements that draw with MT19937
vectorised over positions (numpy), checks it equals torch's bit for bit on a few keys, and times both for
n positions, beside mc_head's own draws: today's per-position one and the "counter" draw (RuleConfig.mask_draw,
one batched hash over every position, other masks). (The evidence for docs/serving.md's choice of default.)

    python scripts/mask_draw_cost.py [--k 5] [--hidden 576] [--p 0.3] [--repeats 7]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dropmatch.decoding.mc_head import keyed_masks

MASK32 = 0xFFFFFFFF


def mt19937_outputs(seeds: list[int], count: int) -> np.ndarray:
    """[n, count] the first outputs of MT19937 seeded (init_genrand) with each seed's low 32 bits."""
    state = np.empty((len(seeds), 624), dtype=np.uint64)
    state[:, 0] = np.asarray([seed & MASK32 for seed in seeds], dtype=np.uint64)
    for j in range(1, 624):
        previous = state[:, j - 1]
        state[:, j] = (1812433253 * (previous ^ (previous >> 30)) + j) & MASK32
    blocks = []
    while sum(block.shape[1] for block in blocks) < count:
        _twist(state)
        blocks.append(_temper(state.copy()))
    return np.concatenate(blocks, 1)[:, :count]


def _twist(state: np.ndarray) -> None:
    """MT19937's state update, in the three chunks whose inputs are already final."""
    for low, high in ((0, 227), (227, 454), (454, 623)):
        y = (state[:, low:high] & 0x80000000) | (state[:, low + 1:high + 1] & 0x7FFFFFFF)
        state[:, low:high] = state[:, (np.arange(low, high) + 397) % 624] ^ (y >> 1) ^ ((y & 1) * 0x9908B0DF)
    y = (state[:, 623] & 0x80000000) | (state[:, 0] & 0x7FFFFFFF)
    state[:, 623] = state[:, 396] ^ (y >> 1) ^ ((y & 1) * 0x9908B0DF)


def _temper(y: np.ndarray) -> np.ndarray:
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return y & MASK32


def vectorised_masks(keys: list[int], num_paths: int, hidden: int, p: float) -> np.ndarray:
    """[n, K * H] 0/1: torch.bernoulli's CPU draw for each key, all positions at once."""
    uniform = (mt19937_outputs(keys, num_paths * hidden) & 0xFFFFFF).astype(np.float32) * np.float32(2.0 ** -24)
    return (uniform < np.float32(1.0 - p)).astype(np.float32)


def torch_masks(keys: list[int], num_paths: int, hidden: int, p: float) -> np.ndarray:
    """[n, K * H] today's draw, position by position (as mc_head.keyed_masks)."""
    generator, rows = torch.Generator(), []
    for key in keys:
        generator.manual_seed(key)
        rows.append(torch.bernoulli(torch.full((num_paths, 1, hidden), 1.0 - p), generator=generator).flatten())
    return torch.stack(rows).numpy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--p", type=float, default=0.3)
    parser.add_argument("--repeats", type=int, default=7, help="draws timed per setting (the median)")
    args = parser.parse_args()
    keys = [12345, 2**32 - 5, 7, 2**63 - 25, 2**40 + 3]
    same = np.array_equal(vectorised_masks(keys, args.k, args.hidden, args.p), torch_masks(keys, args.k, args.hidden, args.p))
    print(f"vectorised MT19937 equals torch's per-position bernoulli on {len(keys)} keys: {same}")
    draws = {"vectorised MT19937": lambda keys: vectorised_masks(keys, args.k, args.hidden, args.p),
             "per position (today)": lambda keys: keyed_masks([(key, 0) for key in keys], args.k, args.p, args.hidden),
             "counter (mask_draw)": lambda keys: keyed_masks([(key, 0) for key in keys], args.k, args.p, args.hidden,
                                                             draw="counter")}
    for n in (1, 16, 256):
        keys = list(range(1, n + 1))
        timings = {name: median_ms(draw, keys, args.repeats) for name, draw in draws.items()}
        print(f"n = {n:3d} positions: " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in timings.items()))
    return 0 if same else 1


def median_ms(draw, keys: list[int], repeats: int) -> float:
    """The median wall time of `repeats` draws, in ms."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        draw(keys)
        times.append(1e3 * (time.perf_counter() - started))
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    raise SystemExit(main())
