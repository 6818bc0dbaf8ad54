"""A trained lossy judge (AutoJudge, arXiv 2504.20039), applied with torch: the rival DropMatch is
measured against, and a rule that combines with it.

A logistic regression over the target's final hidden state on reading a drafted token (AutoJudge's
"DT" features; the engine has them from the verify pass, hidden[i + 1] for drafted token i) scores
how likely it is that accepting this mismatch changes the answer ("important"). The `judge` rule
accepts a mismatch the judge scores below its threshold. Trained by scripts/mine_judge.py on GSM8K
*train* questions with the embedded pair; shipped as assets/judge/judge.json (the standardisation,
the weights, the validation-chosen threshold and its grid). Pure: no model here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

JUDGE_FORMAT, JUDGE_VERSION = "dropmatch-judge", 1
SHIPPED_JUDGE = Path(__file__).resolve().parents[2] / "assets" / "judge" / "judge.json"


class JudgeFileError(ValueError):
    """A judge file that cannot be used; the message is one line, meant to be shown as is."""


@dataclass(frozen=True)
class TrainedJudge:
    """target: the model it was trained on (CausalLM.name); mean, scale, weight [H] float64;
    threshold: the validation-chosen one; thresholds: the validation quantiles (the frontier's knob)."""

    target: str
    mean: torch.Tensor
    scale: torch.Tensor
    weight: torch.Tensor
    bias: float
    threshold: float
    thresholds: tuple[float, ...]
    validation: dict

    @property
    def hidden_size(self) -> int:
        return int(self.weight.shape[0])

    @classmethod
    def read(cls, path: Path | str) -> "TrainedJudge":
        """The judge in a file; JudgeFileError with one line if it is not one."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise JudgeFileError(f"{path} is not a judge file: {type(error).__name__}") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data, where: str = "the judge") -> "TrainedJudge":
        if not isinstance(data, dict) or data.get("format") != JUDGE_FORMAT:
            raise JudgeFileError(f"{where} is not a judge file (no \"format\": \"{JUDGE_FORMAT}\")")
        if data.get("version") != JUDGE_VERSION:
            raise JudgeFileError(f"{where} is judge format version {data.get('version')!r}; this reads {JUDGE_VERSION}")
        try:
            vectors = [torch.tensor(data[name], dtype=torch.float64) for name in ("mean", "scale", "weight")]
            bias, threshold = float(data["bias"]), float(data["threshold"])
            thresholds = tuple(float(t) for t in data["thresholds"])
            target = str(data["target"])
        except (KeyError, TypeError, ValueError) as error:
            raise JudgeFileError(f"{where} lacks a usable {error}") from None
        sizes = {v.dim() == 1 and int(v.shape[0]) for v in vectors}
        if len(sizes) != 1 or not sizes.pop():
            raise JudgeFileError(f"{where}: mean, scale and weight must be vectors of one length")
        if not all(bool(torch.isfinite(v).all()) for v in vectors) or not math.isfinite(bias) or \
                bool((vectors[1] <= 0).any()):
            raise JudgeFileError(f"{where}: its numbers must be finite, and every scale positive")
        if not 0.0 <= threshold <= 1.0:
            raise JudgeFileError(f"{where}: its threshold must be in [0, 1], got {threshold:g}")
        return cls(target, *vectors, bias, threshold, thresholds, dict(data.get("validation") or {}))

    def check_fits(self, target_name: str, hidden_size: int) -> None:
        """JudgeFileError (one line) unless the judge was trained on this target."""
        if target_name != self.target or hidden_size != self.hidden_size:
            raise JudgeFileError(f"this judge was trained on {self.target} (hidden size {self.hidden_size}); "
                                 f"the target is {target_name} (hidden size {hidden_size})")

    def filled(self, rule):
        """rule (a config.RuleConfig) with this judge's validation-chosen threshold where it sets none."""
        return rule if rule.judge_threshold is not None else dataclasses.replace(rule, judge_threshold=self.threshold)

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, H] -> [n] the probability that accepting each mismatch changes the answer."""
        standard = (hidden.double() - self.mean.to(hidden.device)) / self.scale.to(hidden.device)
        return torch.sigmoid(standard @ self.weight.to(hidden.device) + self.bias).to(torch.float32)


def judge_for(target_name: str, hidden_size: int, path: Path = SHIPPED_JUDGE) -> TrainedJudge | None:
    """The shipped judge when it was trained on this target; None otherwise (another pair, or no file)."""
    if not path.exists():
        return None
    judge = TrainedJudge.read(path)
    try:
        judge.check_fits(target_name, hidden_size)
    except JudgeFileError:
        return None
    return judge
