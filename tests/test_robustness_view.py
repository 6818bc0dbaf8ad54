"""The Robustness view: one line per lossy run across the benchmarks, the judge's distribution first,
filled markers only inside the band; its table says the same numbers."""

from __future__ import annotations

from dropmatch.plots import robustness_figure, robustness_rows
from dropmatch.ui.views import robustness_markdown
import pytest

INSIDE = {"nll": True, "off_nucleus": True, "repetition": True}


def run(tau: float, band: dict, accuracy=None) -> dict:
    return {"tau": tau, "speedup_vs_lossless": tau / 2.0, "delta_target_nll": 0.01, "delta_off_nucleus_rate": 0.0,
            "delta_distinct2": -0.01, "band": band, "accuracy": accuracy}


DOCUMENT = {
    "settings": {"command": "python -m dropmatch.bench --rules lossless,dropmatch,judge"},
    "benchmarks": {
        "mt_bench": {"kind": "mt_bench", "rules": {"lossless": run(2.0, INSIDE), "judge": run(2.1, INSIDE),
                                                   "dropmatch": run(2.4, {**INSIDE, "repetition": False})}},
        "gsm8k_test_100": {"kind": "gsm8k", "rules": {"lossless": run(2.0, INSIDE, 0.1), "judge": run(2.6, INSIDE, 0.1),
                                                      "dropmatch": run(2.3, INSIDE, 0.05)}},
    },
}


def test_rows_give_tau_gain_against_lossless_and_place_gsm8k_in_the_judges_distribution():
    rows = {(r["benchmark"], r["run"]): r for r in robustness_rows(DOCUMENT)}
    assert set(rows) == {(b, r) for b in ("mt_bench", "gsm8k_test_100") for r in ("judge", "dropmatch")}
    assert abs(rows["gsm8k_test_100", "judge"]["tau_gain"] - 0.3) < 1e-12
    assert rows["gsm8k_test_100", "judge"]["place"] == "in" and rows["mt_bench", "judge"]["place"] == "out"


def test_the_figure_draws_each_run_in_both_panels_in_distribution_first_and_marks_the_band():
    figure = robustness_figure(DOCUMENT)
    lines = {(trace.legendgroup, trace.xaxis): trace for trace in figure.data}
    assert set(lines) == {(name, axis) for name in ("judge", "dropmatch") for axis in ("x", "x2")}
    dropmatch = lines["dropmatch", "x"]
    assert list(dropmatch.x) == ["gsm8k_test_100 (in)", "mt_bench (out)"]
    assert list(dropmatch.marker.symbol) == ["circle", "circle-open"]  # outside the band on repetition
    assert [round(v, 6) for v in dropmatch.y] == [15.0, 20.0]
    assert dropmatch.name.replace("<br>", " ") == "DropMatch (JS, then majority)"  # as a reader names it


def test_without_results_the_view_says_so_instead_of_drawing_nothing():
    assert robustness_rows(None) == []
    assert "no robustness results" in robustness_figure(None).layout.annotations[0].text
    assert robustness_markdown(None).startswith("No robustness results")


def test_the_table_has_a_row_per_benchmark_and_run_with_its_band_and_command():
    """Sets named as a reader counts them (how many of the file's prompts ran, where the file says its count)."""
    document = {**DOCUMENT, "benchmarks": {name: {**b, "prompts": 10} for name, b in DOCUMENT["benchmarks"].items()}}
    table = robustness_markdown(document)
    assert "| MT-Bench, 10 prompts (out) | DropMatch (JS, then majority) | +20.0% | 1.20x |" in table
    assert "no: repetition" in table
    assert "| GSM8K test, 10 of 100 (in) | trained judge (AutoJudge) | +30.0% |" in table and "0.100 (0.100)" in table
    assert "python -m dropmatch.bench --rules lossless,dropmatch,judge" in table


def test_a_run_with_a_setting_is_named_with_it():
    from dropmatch.plots import run_label

    assert run_label("dropmatch@p=0.3") == "DropMatch (JS, then majority), p = 0.3"
    assert run_label("dropmatch_judge") == "DropMatch + trained judge"


def test_the_shipped_results_show_the_rivals_lines_in_both_tabs():
    """The app's Robustness and Trade-offs tabs read the shipped documents: both hold the training-free
    rivals beside DropMatch, and each frontier point says which run it comes from."""
    from dropmatch.assets import load_frontier, load_robustness

    robustness = {row["rule"] for row in robustness_rows(load_robustness())}
    assert {"dropmatch", "mars", "ensemble", "judge"} <= robustness and "margin" not in robustness
    for benchmark in load_robustness()["benchmarks"].values():  # the yardstick the target itself passes
        assert all(benchmark["rules"]["lossless"]["band"].values())
    frontier = load_frontier()
    swept = {point["rule"] for point in frontier["frontier"] if point["benchmark"] == "all"}
    assert {"dropmatch", "fly", "mars", "ensemble", "judge", "typical", "fixed_js"} <= swept
    assert "margin" not in swept  # the project's own p2/p1 rule, once shown under MARS's name, is gone
    assert all(point.get("run") for point in frontier["frontier"])


def test_the_shipped_same_drafts_comparison_covers_every_set_in_full_at_both_policies_with_intervals():
    """The Robustness tab's first table: every shipped prompt set in full at the Studio's policy and at 15, each
    rival's gain against DropMatch with its interval, and what each added as the target sees it; at gamma 15
    FLy accepts beyond the exact test on HumanEval."""
    from dropmatch.assets import load_same_drafts
    from dropmatch.ui.views import same_drafts_markdown

    document = load_same_drafts()
    labels = {info["label"] for info in document["same_drafts_info"]["sets"].values()}
    assert labels == {"GSM8K test, 100 of 100", "HumanEval, 40 of 40", "MT-Bench, 80 of 80", "IFEval, 20 of 20",
                      "multilingual chat, 20 of 20"}
    assert set(document["same_drafts"]) == {"studio", "long"}
    assert document["same_drafts"]["long"]["humaneval_40"]["fly"]["beyond_exact"]["value"] > 0
    table = same_drafts_markdown(document)
    assert "| fixed 15 | HumanEval, 40 of 40 |" in table and "MARS vs DropMatch" in table
    assert "[" in table and ("leads" in table or "trails" in table) and "<details>" in table


def _trajectory_row(lossless: tuple[int, int, float], **runs: tuple[int, int, float]) -> dict:
    """One prompt row of a trajectory run: per run label, (emitted, rounds, wall_s)."""
    fields = ("emitted", "rounds", "wall_s")
    return {"prompt": "q", **{label: dict(zip(fields, counts)) for label, counts in
                              {"lossless": lossless, **runs}.items()}}


def test_trajectory_gains_are_paired_over_prompts_and_said_only_beyond_their_interval():
    """A run that doubles tau on every prompt leads by +100% with no spread; a run equal to lossless SD ties
    at 0; a run better on some prompts and worse on others ties (its interval holds 0)."""
    from dropmatch.intervals import trajectory_gains

    rows = [_trajectory_row((10 * (i + 1), 10, 1.0 + i), double=(20 * (i + 1), 10, 1.0 + i),
                            same=(10 * (i + 1), 10, 1.0 + i)) for i in range(8)]
    rows += [_trajectory_row((10, 10, 1.0), mixed=(15 if i % 2 else 6, 10, 1.0)) for i in range(8)]
    gains = trajectory_gains(rows, "lossless")
    assert gains["double"]["tau_gain"] == pytest.approx({"value": 1.0, "low": 1.0, "high": 1.0, "standing": "leads"})
    assert gains["double"]["speed"]["value"] == pytest.approx(2.0)
    assert gains["same"]["tau_gain"]["standing"] == "ties" and gains["same"]["tau_gain"]["value"] == 0
    mixed = gains["mixed"]["tau_gain"]
    assert mixed["low"] < 0 < mixed["high"] and mixed["standing"] == "ties"
    assert trajectory_gains([{"prompt": "q", "lossless": {"text": "a"}, "mars": {"text": "b"}}], "lossless") == {}


def test_the_robustness_table_gives_intervals_where_the_document_keeps_per_prompt_counts():
    document = {"settings": {"command": "python -m dropmatch.bench ...", "seed": 0},
                "benchmarks": {"mt_bench": {"kind": "chat", "prompts": 8, "rules": {
                    "lossless": {"tau": 1.0, "speedup_vs_lossless": 1.0},
                    "mars": {"tau": 2.0, "speedup_vs_lossless": 2.0, "band": {}}}}},
                "prompts": {"mt_bench": [_trajectory_row((10, 10, 1.0), mars=(20, 10, 1.0)) for _ in range(8)]}}
    table = robustness_markdown(document)
    assert "+100.0% [+100.0, +100.0]: leads" in table and "2.00x [2.00, 2.00]" in table
    del document["prompts"]
    assert "| +100.0% | 2.00x |" in robustness_markdown(document)  # an older document: no interval claimed
