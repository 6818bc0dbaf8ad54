"""The cost model: a run priced at its own measured units takes its measured time; the projections
re-price only the verify step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROMPTS

from dropmatch.decoding.config import DecodeConfig, RuleConfig
from tools.cost_model import UnitCosts, judge_step_per_position, predicted_seconds, project
from dropmatch.decoding.engine import run_to_end
from dropmatch.metrics import component_costs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_costs(far_engine):
    """component_costs of lossless SD and DropMatch (p 0.3) on two prompts of the far pair."""
    decode = DecodeConfig(gamma=4, max_new_tokens=30)
    found = {}
    for rule in ("lossless", "dropmatch"):
        traces = [run_to_end(far_engine.speculative(far_engine.encode(prompt), decode, RuleConfig(rule, p=0.3)))
                  for prompt in PROMPTS[:2]]
        found[rule] = component_costs(traces)
    return found


@pytest.mark.parametrize("rule", ["lossless", "dropmatch"])
def test_a_run_priced_at_its_own_units_takes_exactly_its_measured_time(tiny_costs, rule):
    """The parts add up: prefill, draft, forward line, head, verify step and the rest are the whole run."""
    costs = tiny_costs[rule]
    seconds = predicted_seconds(UnitCosts.of(costs), costs, judge_step_per_position(costs))
    assert seconds == pytest.approx(costs["total_s"], rel=1e-9)
    assert (costs["judged"] > 0) == (rule == "dropmatch")


def test_projections_reprice_only_the_judge_step(tiny_costs):
    """Free verify step >= any priced one; a verify step priced at what it measured gives the prediction."""
    found = project(tiny_costs["lossless"], tiny_costs["dropmatch"])
    free = found["projections"]["verify step free (the bound on this machine)"]
    assert all(free >= value for value in found["projections"].values())
    assert found["predicted"] <= free
    unit = UnitCosts.of(tiny_costs["lossless"])
    same = predicted_seconds(unit, tiny_costs["dropmatch"], found["judge_step_per_position_s"])
    assert found["predicted"] == pytest.approx(tiny_costs["dropmatch"]["tokens"] / same
                                               / (tiny_costs["lossless"]["tokens"] / tiny_costs["lossless"]["total_s"]))


def test_the_projection_script_prints_the_table_and_refuses_a_file_without_costs(tmp_path, tiny_costs):
    """scripts/project_speed.py on a document with costs: a table per benchmark and pooled; without: one line."""
    document = {"benchmarks": {"b": {"rules": {"lossless": {"costs": tiny_costs["lossless"]},
                                               "dropmatch": {"costs": tiny_costs["dropmatch"]}}}}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    script = [sys.executable, str(ROOT / "scripts" / "project_speed.py")]
    out = subprocess.run([*script, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| b | dropmatch |" in out.stdout and "| pooled | dropmatch |" in out.stdout
    path.write_text(json.dumps({"benchmarks": {"b": {"rules": {"lossless": {}}}}}))
    out = subprocess.run([*script, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no runs with component costs" in out.stderr
