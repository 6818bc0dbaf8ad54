"""Bootstrap intervals over prompts (DESIGN.md §2: ratios within one run, prompt by prompt).

A set's figure is a ratio of sums over its prompts (tau = emitted tokens / rounds); its interval is the
LEVEL percentile interval of that ratio over RESAMPLES resamples of the prompts, drawn with replacement
and seeded. A gain of one rule over another (figure_rule / figure_other - 1) is computed within each
resample, on the same prompts (paired). A lead or a trail is said only beyond the interval (`standing`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


@dataclass
class Estimate:
    """A set's figure (None where undefined) and its value in each bootstrap resample ([B], NaN where undefined)."""
    value: float | None
    samples: np.ndarray

    def shown(self) -> dict | None:
        """{"value", "low", "high"}: the figure and its LEVEL percentile interval; None where undefined."""
        if self.value is None or np.isnan(self.samples).all():
            return None
        tail = 100 * (1 - LEVEL) / 2
        low, high = np.nanpercentile(self.samples, [tail, 100 - tail])
        return {"value": self.value, "low": float(low), "high": float(high)}


def ratio(numerator: np.ndarray, denominator: np.ndarray, picks: np.ndarray) -> Estimate:
    """sum(numerator) / sum(denominator) over the prompts [n], and over each resample of them (picks [B, n])."""
    total = denominator.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = numerator[picks].sum(1) / denominator[picks].sum(1)
    return Estimate(float(numerator.sum() / total) if total else None, np.where(np.isfinite(samples), samples, np.nan))


def gain(rule: Estimate, other: Estimate) -> Estimate:
    """rule / other - 1, on the figures and within each resample (paired: the same prompts)."""
    value = rule.value / other.value - 1 if rule.value is not None and other.value else None
    with np.errstate(divide="ignore", invalid="ignore"):
        return Estimate(value, rule.samples / other.samples - 1)


def standing(interval: dict, other: dict | None = None) -> str:
    """"leads", "trails" or "ties", said only beyond the intervals: with `other`, two figures' intervals
    (leads where this one's low end lies above the other's high end); without, a gain's interval against 0."""
    above, below = (other["high"], other["low"]) if other is not None else (0.0, 0.0)
    if interval["low"] > above:
        return "leads"
    if interval["high"] < below:
        return "trails"
    return "ties"


def resample_picks(n: int, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """[resamples, n] prompt indices drawn with replacement, seeded."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def block_picks(n: int, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """[resamples, n] indices of one run's n rounds redrawn in contiguous blocks (circular block bootstrap):
    blocks of round(sqrt(n)) neighbouring rounds from random starts, wrapping past the last, cut to n.
    Neighbouring rounds are not independent (the same stretch of text, the machine's state); wrapping keeps
    every round equally likely, so a resample's expected sum is the run's own."""
    block = max(1, round(n ** 0.5))
    blocks = -(-n // block)
    starts = np.random.default_rng(seed).integers(0, n, size=(resamples, blocks, 1))
    return ((starts + np.arange(block)) % n).reshape(resamples, blocks * block)[:, :n]


def trajectory_gains(rows: list[dict], baseline: str, seed: int = 0) -> dict[str, dict]:
    """One prompt set of a trajectory run (bench --json "prompts"[set]: per prompt, {run label: {"emitted",
    "rounds", "wall_s", ...}}) -> {run label: {"tau_gain": {value, low, high, standing}, "speed": {value,
    low, high}}}: each run's tau (emitted / rounds) and tokens/s (emitted / wall) against `baseline`'s,
    paired over the prompts where both ran. {} where the rows predate the per-prompt counts."""
    def counted(row: dict, label: str) -> bool:
        return isinstance(row.get(label), dict) and "emitted" in row[label] and "rounds" in row[label]

    labels = dict.fromkeys(label for row in rows for label in row if counted(row, label) and label != baseline)
    out = {}
    for label in labels:
        both = [row for row in rows if counted(row, label) and counted(row, baseline)]
        if not both:
            continue
        picks = resample_picks(len(both), seed)
        tau_gain, speed_gain = (gain(_per(both, label, name, picks), _per(both, baseline, name, picks)).shown()
                                for name in ("rounds", "wall_s"))
        out[label] = {"prompts": len(both),
                      "tau_gain": tau_gain and {**tau_gain, "standing": standing(tau_gain)},
                      "speed": speed_gain and {name: value + 1 for name, value in speed_gain.items()}}
    return out


def _per(rows: list[dict], run: str, name: str, picks: np.ndarray) -> Estimate:
    """`run`'s emitted tokens per its field `name` (rounds: tau; wall_s: tokens/s) over the prompt rows (ratio)."""
    return ratio(*(np.array([row[run][field] for row in rows], dtype=float) for field in ("emitted", name)), picks)
