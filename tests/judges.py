"""Trained judges made by the tests: random logistic regressions of a given hidden size."""

from __future__ import annotations

import torch

from dropmatch.decoding.trained_judge import JUDGE_FORMAT, JUDGE_VERSION, TrainedJudge


def judge_dict(hidden_size: int, seed: int = 0, target: str = "tiny", threshold: float = 0.5) -> dict:
    """A judge file's contents: standardisation and weights drawn from the seed."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "format": JUDGE_FORMAT, "version": JUDGE_VERSION, "target": target, "hidden_size": hidden_size,
        "mean": (torch.randn(hidden_size, generator=generator) * 0.1).tolist(),
        "scale": (torch.rand(hidden_size, generator=generator) + 0.5).tolist(),
        "weight": torch.randn(hidden_size, generator=generator).tolist(), "bias": 0.0,
        "threshold": threshold, "thresholds": [0.0, 0.25, 0.5, 0.75, 1.0], "validation": {},
    }


def random_judge(hidden_size: int, seed: int = 0, target: str = "tiny", threshold: float = 0.5) -> TrainedJudge:
    return TrainedJudge.from_dict(judge_dict(hidden_size, seed, target, threshold))
