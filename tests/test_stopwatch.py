"""One stopwatch (issue 66) and the target alone as a user runs it (issue 63): every speed compares the same
phases measured the same way, its interval resamples what its point measures, and "vs the target alone" is
transformers' generate() on the same loaded target. No test times anything: fake engines carry fake times."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fake_engine import FakeEngine

from dropmatch.compare import compare_stream
from dropmatch.decoding.config import DecodeConfig, RuleConfig, Settings
from dropmatch.metrics import speed_ratio_interval, tokens_per_s

ROOT = Path(__file__).resolve().parent.parent
COLD_S = 2.0  # what a first call into the models costs on top (a recorded run's: 2.05 s of prefill against 0.19 s)
PROMPT = " ".join(f"w{i}" for i in range(40))


class ColdFirstCall(FakeEngine):
    """A fake engine whose first speculative run's prefill pays a cold start, as a freshly loaded model does."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def speculative(self, *args, **kwargs):
        self.calls += 1
        cold = self.calls == 1
        trace = yield from super().speculative(*args, **kwargs)
        return replace(trace, t_prefill=trace.t_prefill + COLD_S, t_total=trace.t_total + COLD_S) if cold else trace


def _point(lossless, lossy) -> float:
    return tokens_per_s(lossy) / tokens_per_s(lossless)


def _inside(point: float, interval: tuple[float, float]) -> bool:
    low, high = interval
    return low * (1 - 1e-9) <= point <= high * (1 + 1e-9)


def test_warm_up_is_paid_before_either_column_is_timed():
    """A first call that starts cold falls on the warm-up, so both columns' prefills are the warm one."""
    decode, rule = Settings(PROMPT, max_new_tokens=40, gamma="4", p="0.3").parse()
    *_, state = compare_stream(ColdFirstCall(), PROMPT, decode, rule, run_ar=False)
    lossless, lossy = state.lossless.trace, state.lossy.trace
    assert lossless.t_prefill == lossy.t_prefill < COLD_S
    assert _inside(_point(lossless, lossy), speed_ratio_interval(lossless, lossy))


def test_the_speed_interval_holds_its_point_on_a_cold_first_column():
    """A run whose first column paid a cold start: the interval resamples what the point measures (end to
    end, prefill kept), so the point (output / wall time) lies inside it."""
    engine = FakeEngine()
    ids = engine.encode(PROMPT)
    decode = DecodeConfig(gamma=4, max_new_tokens=40)
    lossless = compare_trace(engine, ids, decode, RuleConfig("lossless"))
    lossless = replace(lossless, t_prefill=lossless.t_prefill + COLD_S, t_total=lossless.t_total + COLD_S)
    lossy = compare_trace(engine, ids, decode, RuleConfig("dropmatch", p=0.3))
    assert _point(lossless, lossy) > 1.5  # the cold start makes the point, and the interval must carry it
    assert _inside(_point(lossless, lossy), speed_ratio_interval(lossless, lossy))


def compare_trace(engine, ids, decode, rule):
    from dropmatch.decoding.engine import run_to_end

    return run_to_end(engine.speculative(ids, decode, rule))


@pytest.mark.parametrize("path", sorted((ROOT / "assets" / "recorded").glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_runs_speed_point_lies_inside_its_interval(path):
    """The verdict's interval and its point measure the same thing on every shipped run."""
    from dropmatch.runfile import read_recorded_run

    record = read_recorded_run(path)
    interval = speed_ratio_interval(record.lossless, record.lossy)
    assert interval is not None and _inside(_point(record.lossless, record.lossy), interval)


def test_the_apps_speed_against_the_target_alone_reads_generates_rate(tiny_engine, tmp_path):
    """The app's "vs the target alone" is each column's tokens/s over transformers' generate()'s on the same
    target and prompt (timed in the comparison), not the engine's own autoregressive run; a run file keeps it."""
    from dropmatch.runfile import Downloads, read_recorded_run, record_of

    decode, rule = Settings("what is two plus three?", max_new_tokens=12, gamma="3", p="0.3").parse()
    *_, state = compare_stream(tiny_engine, "what is two plus three?", decode, rule)
    alone = state.target_alone
    assert alone["tokens"] == len(state.ar.output_ids) and alone["seconds"] > 0  # greedy: the target's own text
    record = record_of(state, tiny_engine)
    rate = alone["tokens"] / alone["seconds"]
    for metrics, trace in zip(record.metrics(), (record.lossless, record.lossy)):
        assert metrics.speedup_vs_ar == pytest.approx(tokens_per_s(trace) / rate)
    trace_path, _ = Downloads(tmp_path).write(record)
    assert read_recorded_run(trace_path).target_alone == alone
    assert json.loads(Path(trace_path).read_text())["target_alone"] == alone


def _generate_rows(seconds: list[float], tokens: int) -> list[dict]:
    return [{"tokens": tokens, "seconds": s, "ours": "lossless", "identical_to_lossless": True} for s in seconds]


def test_the_tables_vs_ar_column_reads_generates_rate():
    """With --peer's generate() rows, "vs AR" of every rule (and of the engine's own loop) is its tokens/s over
    generate()'s on the same prompts, in the summary, the text table, the HTML and Markdown tables."""
    from test_bench import band_result

    from dropmatch.bench import format_table
    from dropmatch.bench.report import _table, markdown_table
    from dropmatch.bench.summary import summarize_benchmark
    from dropmatch.bench.tables import VS_GENERATE

    result = band_result(0.0, own_distinct2=0.4, lossy_distinct2=0.4, samples_distinct2=0.4)
    tokens = len(result.runs["lossless"][0].trace.output_ids)
    result.peers["generate"] = _generate_rows([tokens / 7.0], tokens)  # 7 tokens/s: no run's own rate
    summary = summarize_benchmark(result)
    assert summary["peers"]["generate"]["tokens_per_s"] == pytest.approx(7.0)
    lossless = summary["rules"]["lossless"]
    assert summary["peers"]["generate"]["ours_over_peer"] == pytest.approx(lossless["tokens_per_s"] / 7.0)
    for stats in summary["rules"].values():
        assert stats["speedup_vs_ar"] == pytest.approx(stats["tokens_per_s"] / 7.0)
    loop = summary["autoregressive"]["speedup_vs_ar"]
    assert loop == pytest.approx(summary["autoregressive"]["tokens_per_s"] / 7.0)
    document = {"settings": {"command": "python -m dropmatch.bench ..."}, "benchmarks": {"set": summary}}
    for shown in (format_table("set", summary), _table(document), markdown_table(document)):
        assert f"{lossless['tokens_per_s'] / 7.0:.2f}x" in shown and f"{loop:.2f}x" in shown
        assert VS_GENERATE in shown.replace("&#x27;", "'")


def test_the_bench_writes_generates_rate_per_prompt_set_with_peer(tiny_dirs, tmp_path, capsys):
    """`--rules lossless,dropmatch --peer --json` writes benchmarks[set]["peers"]["generate"] (tokens/s, ours
    over it), and the rules' speedup_vs_ar is held against it."""
    from test_bench import PROMPTS, in_process

    target, draft = tiny_dirs
    out_json = tmp_path / "out.json"
    status, stderr = in_process(capsys, "--prompts", str(PROMPTS / "gsm8k_test_100.jsonl"), "--limit", "2",
                                "--max-new-tokens", "8", "--gamma", "3", "--rules", "lossless,dropmatch", "--peer",
                                "--target", str(target), "--draft", str(draft), "--json", str(out_json))
    assert status == 0, stderr[-2000:]
    numbers = json.loads(out_json.read_text())["benchmarks"]["gsm8k_test_100"]
    alone = numbers["peers"]["generate"]
    assert alone["tokens_per_s"] > 0 and alone["identical_to_lossless"] is True
    assert alone["ours_over_peer"] == pytest.approx(numbers["rules"]["lossless"]["tokens_per_s"] / alone["tokens_per_s"])
    assert numbers["rules"]["lossless"]["speedup_vs_ar"] == pytest.approx(alone["ours_over_peer"])
    assert numbers["vs_ar_against"].startswith("transformers' generate()")
    rows = json.loads(out_json.read_text())["prompts"]["gsm8k_test_100"]
    assert [row["peers"]["generate"]["tokens"] for row in rows] and all(row["peers"]["generate"]["seconds"] > 0 for row in rows)
    assert all(row["autoregressive_timing"]["wall_s"] > 0 for row in rows)
