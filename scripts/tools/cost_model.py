"""Where DropMatch pays: tokens per second predicted from a run's acceptance and measured unit costs.

A speculative run's time is its prefill, plus per round a draft, a target forward over the verified
positions, the clean head, the verify step and some bookkeeping. `UnitCosts.of` reads what one run
measured per unit (metrics.component_costs): seconds per token the draft model drafted, the target's
forward as a line in the positions it verifies (least squares over the run's rounds), the head per
verified position, the rest per round and the prefill per prompt. `predict` prices another run's
counts (its rounds, positions, drafted tokens, judged positions) at those units plus that run's own
judge-step cost per judged position, so a prediction of DropMatch from lossless SD's units says how
much of DropMatch's speed its acceptance and its measured Monte-Carlo cost explain.

`project` re-prices the verify step at cost shapes this machine does not have (labelled projections,
never measurements): the method's Llama-3.1-70B figure (the head-only MC pass at 1.64% of a step),
and a GPU where K head rows cost what one does (one clean head pass per judged position).
"""

from __future__ import annotations

from dataclasses import dataclass

METHOD_MC_SHARE_70B = 0.0164  # arXiv 2603.03333: the MC head pass on Llama-3.1-70B, as a share of a step


@dataclass(frozen=True)
class UnitCosts:
    """Seconds per unit, measured in one run."""

    draft_token: float
    forward_base: float
    forward_per_position: float
    head_per_position: float
    other_per_round: float
    prefill_per_prompt: float

    @classmethod
    def of(cls, costs: dict) -> "UnitCosts":
        """The units of one run's component_costs (a run with at least one round)."""
        n, x, y = costs["rounds"], costs["positions"], costs["forward_s"]
        spread = n * costs["positions_sq"] - x * x
        slope = (n * costs["forward_x_positions"] - x * y) / spread if spread > 0 else 0.0
        base = (y - slope * x) / n
        return cls(draft_token=costs["draft_s"] / max(costs["model_drafted"], 1), forward_base=base,
                   forward_per_position=slope, head_per_position=costs["head_s"] / max(x, 1),
                   other_per_round=costs["other_s"] / n, prefill_per_prompt=costs["prefill_s"] / max(costs["prompts"], 1))


def judge_step_per_position(costs: dict) -> float:
    """A run's measured judge-step seconds per judged position (0 where it judged nothing)."""
    return costs["mc_s"] / costs["judged"] if costs["judged"] else 0.0


def predicted_seconds(units: UnitCosts, costs: dict, judge_per_position: float) -> float:
    """The time of the run whose counts `costs` gives, priced at `units` and the verify step's cost."""
    return (units.prefill_per_prompt * costs["prompts"] + costs["calibration_s"]
            + units.draft_token * costs["model_drafted"]
            + units.forward_base * costs["rounds"] + units.forward_per_position * costs["positions"]
            + units.head_per_position * costs["positions"] + units.other_per_round * costs["rounds"]
            + judge_per_position * costs["judged"])


def predict(units: UnitCosts, costs: dict, judge_per_position: float | None = None) -> float:
    """Predicted tokens per second of a run (its own measured judge-step cost unless given)."""
    per_position = judge_step_per_position(costs) if judge_per_position is None else judge_per_position
    return costs["tokens"] / predicted_seconds(units, costs, per_position)


def project(lossless: dict, lossy: dict) -> dict:
    """The lossy run's speed against lossless SD's, measured and predicted (from lossless SD's units),
    and projected at other judge-step costs. lossless, lossy: component_costs of the two runs."""
    units = UnitCosts.of(lossless)
    measured = lossless["tokens"] / lossless["total_s"]
    ratio = lambda per_position: predict(units, lossy, per_position) / measured  # noqa: E731
    forward_per_round = units.forward_base + units.forward_per_position * lossy["positions"] / max(lossy["rounds"], 1)
    judged_rounds_share = lossy["judged"] / max(lossy["rounds"], 1)
    return {
        "measured": (lossy["tokens"] / lossy["total_s"]) / measured,
        "predicted": ratio(judge_step_per_position(lossy)),
        "judge_step_per_position_s": judge_step_per_position(lossy),
        "projections": {
            "verify step free (the bound on this machine)": ratio(0.0),
            "MC pass at 1.64% of a step (the method's 70B figure)":
                ratio(METHOD_MC_SHARE_70B * forward_per_round / judged_rounds_share if lossy["judged"] else 0.0),
            "K head rows cost what one does (a GPU)": ratio(units.head_per_position * lossy["positions"]
                                                            / max(lossy["rounds"], 1)),
        },
    }
