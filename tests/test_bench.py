"""The benchmark CLI: one-line errors, the JSON it writes, quality scoring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dropmatch import quality

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "assets" / "prompts"


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The CLI in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "dropmatch.bench", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def in_process(capsys, *args: str) -> tuple[int, str]:
    """(exit status, stderr) of the CLI's main called in this process (the command as typed has its own test,
    test_the_command_writes_the_promised_fields_per_rule): an exception escaping main fails the test, as its
    traceback would in a terminal."""
    from dropmatch.bench import main

    capsys.readouterr()
    try:
        status = main(list(args))
    except SystemExit as exit_:  # argparse's own refusals
        status = exit_.code
    return status, capsys.readouterr().err


@pytest.fixture()
def one_prompt(tmp_path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hello"}) + "\n")
    return path


@pytest.mark.parametrize("extra, message", [
    (["--gamma", "0"], "gamma"),
    (["--k", "0"], "K"),
    (["--p", "1.0"], "dropout rate"),
    (["--p", "-0.1"], "dropout rate"),
    (["--rules", "lossless,telepathy"], "unknown rule"),
    (["--temperature", "abc"], "temperature"),
    (["--limit", "0"], "--limit"),
    (["--max-new-tokens", "nan"], "max new tokens"),
    (["--draft-source", "eagle3"], "--eagle3-head"),
])
def test_bad_arguments_end_with_one_line_not_a_traceback(one_prompt, extra, message, capsys):
    status, stderr = in_process(capsys, "--prompts", str(one_prompt), *extra)
    assert status == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], stderr


@pytest.mark.slow  # a subprocess: the command as a user types it
def test_the_command_refuses_a_bad_argument_in_one_line_without_a_traceback(one_prompt):
    out = bench("--prompts", str(one_prompt), "--gamma", "0")
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "gamma" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_empty_and_missing_prompt_files_are_one_line_errors(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    for path, message in ((empty, "holds no prompts"), (tmp_path / "nope.jsonl", "not found")):
        status, stderr = in_process(capsys, "--prompts", str(path))
        assert status == 2 and stderr.strip().count("\n") == 0 and message in stderr, stderr


@pytest.mark.slow  # two models' runs and transformers' peer: the full suite's
def test_under_sampling_the_peer_is_transformers_static_ensemble_at_our_ensembles_weight(tiny_dirs, tmp_path, capsys):
    """--peer with the ensemble rule under sampling runs transformers' assisted generation with
    assistant_ensemble_weight at the same weight, temperature and draft, held against our ensemble run,
    with its text's target NLL beside ours."""
    target, draft = tiny_dirs
    out_json = tmp_path / "out.json"
    status, stderr = in_process(capsys, "--prompts", str(PROMPTS / "gsm8k_test_100.jsonl"), "--limit", "2",
                                "--max-new-tokens", "12", "--gamma", "3", "--temperature", "1.0", "--rules",
                                "lossless,ensemble", "--peer", "--target", str(target), "--draft", str(draft),
                                "--json", str(out_json))
    assert status == 0, stderr[-2000:]
    peers = json.loads(out_json.read_text())["benchmarks"]["gsm8k_test_100"]["peers"]
    assert set(peers) == {"generate", "ensemble_assisted"}  # and the target alone, sampled as the run
    peer = peers["ensemble_assisted"]
    assert peer["against"] == "ensemble" and "assistant_ensemble_weight" in peer["name"]
    assert peer["tokens_per_s"] > 0 and peer["ours_over_peer"] > 0 and 0 < peer["target_nll"] < 50


def test_the_peers_target_nll_is_read_as_our_runs_is(tiny_engine):
    """sequence_nll over a run's own tokens equals that run's recorded target NLL."""
    from dropmatch import metrics
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end
    from dropmatch.models import sequence_nll

    ids = tiny_engine.encode("what is two plus three?")
    trace = run_to_end(tiny_engine.speculative(ids, DecodeConfig(gamma=3, max_new_tokens=16), RuleConfig("lossless")))
    assert abs(sequence_nll(tiny_engine.target, ids, list(trace.output_ids)) - metrics.target_nll(trace)) < 1e-3


@pytest.mark.slow  # a subprocess: the full suite's, not the fast tier's
def test_the_command_writes_the_promised_fields_per_rule(tiny_dirs, tmp_path):
    """The command as typed: JSON per rule (tau, acceptance_rate, tokens_per_s, speedup_vs_ar, mc_overhead,
    identity, quality), the HTML report beside a shared plotly.js."""
    target, draft = tiny_dirs
    out_json, out_html = tmp_path / "out.json", tmp_path / "report.html"
    run = bench("--prompts", f"{PROMPTS / 'gsm8k_test_100.jsonl'},{PROMPTS / 'mt_bench.jsonl'}", "--limit", "2",
                "--max-new-tokens", "12", "--gamma", "3", "--rules", "lossless,dropmatch", "--p-sweep", "0,0.3",
                "--sweep-limit", "1", "--peer", "--target", str(target), "--draft", str(draft),
                "--json", str(out_json), "--report", str(out_html))
    assert run.returncode == 0, run.stderr[-2000:]
    document = json.loads(out_json.read_text())
    rules = document["rules"]
    for key in ("tau", "acceptance_rate", "tokens_per_s", "speedup_vs_ar", "mc_overhead", "target_nll", "distinct2", "p"):
        assert key in rules["lossless"] and key in rules["dropmatch"], key
    assert rules["lossless"]["identical_to_target_greedy"] is True
    assert rules["lossless"]["mc_overhead"] is None and rules["dropmatch"]["mc_overhead"] is not None
    gsm8k = document["benchmarks"]["gsm8k_test_100"]
    assert gsm8k["rules"]["lossless"]["accuracy"] is not None
    assert set(gsm8k["peers"]) == {"generate", "assisted", "prompt_lookup"}
    assert all(peer["identical_to_lossless"] is True for peer in gsm8k["peers"].values())
    assert "dropmatch@p=0.3" in gsm8k["rules"]
    assert len(document["prompts"]["mt_bench"]) == 2
    # MT-Bench is sorted by category: two prompts are its first writing and first roleplay question.
    assert [row["category"] for row in document["prompts"]["mt_bench"]] == ["writing", "roleplay"]
    by_category = document["benchmarks"]["mt_bench"]["categories"]
    assert list(by_category) == ["writing", "roleplay"]
    assert all(part["prompts"] == 1 and "lossless" in part["rules"] for part in by_category.values())
    assert "categories" not in gsm8k
    page = out_html.read_text()
    assert "<html" in page and "plotly" in page.lower() and "Sweep over p" in page
    from dropmatch.bench.report import plotlyjs_name

    # plotly.js once beside the report, referenced, not inlined: the page still opens offline from its folder
    assert f'<script src="{plotlyjs_name()}"></script>' in page, "the report does not load the shared plotly.js"
    assert len(page) < 1_000_000, f"the report inlines plotly.js ({len(page)} bytes)"
    assert (out_html.parent / plotlyjs_name()).stat().st_size > 1_000_000, "plotly.js was not written beside the report"


def test_the_bench_drafts_from_an_eagle3_head_and_lossless_stays_the_targets_output(tiny_dirs, tmp_path, capsys):
    """--draft-source eagle3 --eagle3-head DIR: every lossless and DropMatch round drafts from the head, lossless
    greedy output is the target's generate(), and the JSON records the source; a head that does not fit the
    target is refused in one line."""
    from types import SimpleNamespace

    from transformers import AutoConfig
    from tiny_models import save_eagle3_head

    target, draft = tiny_dirs
    config = AutoConfig.from_pretrained(target)
    head = save_eagle3_head(tmp_path / "head", SimpleNamespace(config=config), list(range(0, config.vocab_size, 2)),
                            (0, 1, 1))
    out_json = tmp_path / "out.json"
    common = ("--prompts", f"{PROMPTS / 'gsm8k_test_100.jsonl'}", "--limit", "2", "--max-new-tokens", "12",
              "--gamma", "auto", "--rules", "lossless,dropmatch", "--reference-samples", "0", "--target", str(target),
              "--draft", str(draft), "--draft-source", "eagle3")
    status, stderr = in_process(capsys, *common, "--eagle3-head", str(head), "--json", str(out_json))
    assert status == 0, stderr[-2000:]
    document = json.loads(out_json.read_text())
    assert document["settings"]["draft_source"] == "eagle3" and document["settings"]["eagle3_head"] == str(head)
    assert document["rules"]["lossless"]["identical_to_target_greedy"] is True
    misfit = save_eagle3_head(tmp_path / "misfit", SimpleNamespace(config=config), [1, 2, 3], (0, 1, 5))
    status, stderr = in_process(capsys, *common, "--eagle3-head", str(misfit))
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]  # the loader's progress bars aside
    assert status == 2 and len(errors) == 1 and "layers" in errors[0] and "Traceback" not in stderr, stderr


@pytest.mark.slow  # every rule's sweep: the full suite's, not the fast tier's
def test_frontier_sweeps_every_lossy_rule_and_reports_the_reference_band(tiny_dirs, tmp_path, capsys):
    """--frontier: one point per (rule, centroid, knob value) with the promised fields, for all prompts
    and per benchmark; the reference band of the target's own samples; the HTML draws the frontier."""
    from dropmatch.decoding.acceptance import KNOBS

    target, draft = tiny_dirs
    out_json, out_html = tmp_path / "frontier.json", tmp_path / "frontier.html"
    prompts = f"{PROMPTS / 'gsm8k_test_100.jsonl'}:1,{PROMPTS / 'mt_bench.jsonl'}:1"
    status, stderr = in_process(capsys, "--prompts", prompts, "--max-new-tokens", "8", "--gamma", "3", "--rules",
                                "dropmatch", "--frontier", "--reference-samples", "2", "--target", str(target),
                                "--draft", str(draft), "--json", str(out_json), "--report", str(out_html))
    assert status == 0, stderr[-2000:]
    document = json.loads(out_json.read_text())
    points = document["frontier"]
    assert isinstance(points, list)
    overall = [p for p in points if p["benchmark"] == "all"]
    expected = 2 * len(KNOBS["p"].sweep) + 2 * len(KNOBS["p"].sweep) + len(KNOBS["fixed_js_threshold"].sweep) \
        + len(KNOBS["typical_eps"].sweep) + len(KNOBS["fly_entropy_threshold"].sweep) + len(KNOBS["mars_threshold"].sweep) + len(KNOBS["ensemble_weight"].sweep)
    # dropmatch x 2 centroids, naive, majority, fixed_js, typical, fly, MARS and the ensemble (greedy as transformers)
    assert len(overall) == expected
    assert {p["benchmark"] for p in points} == {"all", "gsm8k_test_100", "mt_bench"}
    for point in overall:
        for key in ("rule", "knob", "value", "tau", "tau_gain", "speed_vs_lossless", "target_nll", "off_nucleus_rate",
                    "accuracy", "within_reference", "distinct2", "band", "delta_target_nll",
                    "delta_off_nucleus_rate", "delta_distinct2"):
            assert key in point, key
        assert set(point["band"]) == {"nll", "off_nucleus", "repetition", "length"}, point["band"]
    assert {p["centroid"] for p in overall if p["rule"] == "dropmatch"} == {"probs", "logits"}
    reference = document["reference"]["target_sampled"]
    assert (reference["temperature"], reference["top_p"], reference["samples"]) == (0.7, 0.95, 2)
    assert reference["target_nll"] > 0 and 0.0 <= reference["off_nucleus_rate"] <= 1.0
    assert 0.0 < reference["distinct2"] <= 1.0
    lossless = document["rules"]["lossless"]
    assert lossless["delta_target_nll"] == 0.0 and lossless["delta_distinct2"] == 0.0  # lossless against itself
    assert "reference" in document["benchmarks"]["gsm8k_test_100"]
    page = out_html.read_text()
    assert "Trade-off frontier" in page and "within the target's own variation" in page


def test_gsm8k_scoring_reads_the_final_number():
    assert quality.gsm8k_correct("She sells 9 eggs, so she makes 9 * 2 = $18.", "...\n#### 18")
    assert quality.gsm8k_correct("The answer is 1,234.", "#### 1234")
    assert not quality.gsm8k_correct("It is 17.", "#### 18")
    assert not quality.gsm8k_correct("no idea", "#### 18")


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
def test_humaneval_sandbox_passes_a_correct_solution_and_fails_wrong_ones():
    problem = json.loads((PROMPTS / "humaneval_40.jsonl").read_text().splitlines()[0])
    correct = "```python\n" + problem["prompt"] + problem["canonical_solution"] + "```"
    assert quality.humaneval_passes(problem, correct)
    assert not quality.humaneval_passes(problem, "```python\ndef has_close_elements(a, b):\n    return True\n```")
    assert not quality.humaneval_passes(problem, "```python\ndef has_close_elements(a, b):\n    while True: pass\n```",
                                        timeout_s=3)


ESCAPES = {
    "io.open": "import io; io.open(CANARY, 'w').write('gone')",
    "os.open": "import os; fd = os.open(CANARY, os.O_WRONLY | os.O_TRUNC); os.write(fd, b'gone')",
    "os.rename": "import os; os.rename(CANARY, CANARY + '.moved')",
    "os.replace": "import os; open('mine', 'w').write('x'); os.replace('mine', CANARY)",
    "shutil.rmtree": "import shutil, os; shutil.rmtree(os.path.dirname(CANARY))",
    "pathlib unlink": "import pathlib; pathlib.Path(CANARY).unlink()",
    "subprocess": "import subprocess; subprocess.run(['rm', '-f', CANARY], check=True)",
    "ctypes": "import ctypes; assert ctypes.CDLL(None).unlink(CANARY.encode()) == 0",
    "socket": "import socket; socket.create_connection(('127.0.0.1', PORT), timeout=2).sendall(b'hello')",
}


@pytest.fixture()
def outside_folder():
    """A folder outside /tmp (which the sandbox replaces), so that the program could see it."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(dir="/var/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("escape", list(ESCAPES))
def test_humaneval_sandbox_keeps_a_canary_outside_its_folder_and_the_network_out_of_reach(escape, outside_folder):
    """A correct solution that first tries to damage a canary file outside its folder (or reach a
    socket on this machine) fails, and the canary survives; the sandbox is the operating system's."""
    import socket

    problem = json.loads((PROMPTS / "humaneval_40.jsonl").read_text().splitlines()[0])
    folder = outside_folder
    canary = folder / "canary.txt"
    canary.write_text("alive")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        attack = ESCAPES[escape].replace("CANARY", repr(str(canary))).replace("PORT", str(listener.getsockname()[1]))
        body = problem["canonical_solution"]
        code = "```python\n" + problem["prompt"] + f"    {attack}\n" + body + "```"
        assert not quality.humaneval_passes(problem, code)
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing reached it
    assert canary.read_text() == "alive" and sorted(p.name for p in folder.iterdir()) == ["canary.txt"]
    correct = "```python\n" + problem["prompt"] + problem["canonical_solution"] + "```"
    assert quality.humaneval_passes(problem, correct)


def test_without_bubblewrap_humaneval_scoring_is_refused_with_a_message(monkeypatch, tmp_path, capsys):
    """No bwrap on the PATH: scoring raises, and the benchmark refuses HumanEval in one line naming the package."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(quality.SandboxUnavailable, match="bubblewrap"):
        quality.sandbox_command(tmp_path)
    status, stderr = in_process(capsys, "--prompts", str(PROMPTS / "humaneval_40.jsonl"), "--limit", "1")
    assert status == 2 and "bubblewrap" in stderr and stderr.count("\n") == 1, stderr


def test_ifeval_checks_follow_the_instructions():
    record = {"instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase",
                                      "startend:end_checker", "unknown:thing"],
              "kwargs": [{}, {}, {"end_phrase": "bye."}, {}]}
    assert quality.ifeval_followed(record, "hello there bye.") == (3, 3)
    assert quality.ifeval_followed(record, "Hello, there") == (0, 3)


def test_distinct2_and_overlap_see_repetition_and_difference():
    assert quality.distinct2([1, 2, 1, 2, 1, 2]) == pytest.approx(2 / 5)
    assert quality.distinct2([1, 2, 3, 4]) == 1.0
    assert quality.token_overlap([1, 2, 3], [1, 2, 3]) == 1.0
    assert quality.token_overlap([1, 2, 3], [4, 5, 6]) == 0.0


def test_a_count_after_the_file_limits_that_file(one_prompt, capsys):
    from dropmatch.bench import parse_file

    assert parse_file(f"{one_prompt}:3", None) == (str(one_prompt), 3)
    assert parse_file(str(one_prompt), 7) == (str(one_prompt), 7)
    status, stderr = in_process(capsys, "--prompts", f"{one_prompt}:0")
    assert status == 2 and "must be at least 1" in stderr, stderr


def test_a_limit_spreads_over_the_categories_of_a_file(tmp_path):
    """A file sorted by category (MT-Bench) is sampled across its categories, in file order; a file
    without categories (or with a record lacking one) gives its first N prompts."""
    from dropmatch.bench import read_prompts

    def write(name, categories):
        path = tmp_path / name
        lines = [{"prompt": f"q{i}", **({"category": c} if c else {})} for i, c in enumerate(categories)]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        return str(path)

    def prompts(path, limit):
        return [item.prompt for item in read_prompts(path, limit)[1]]

    sorted_file = write("sorted.jsonl", ["a", "a", "a", "b", "b", "c"])
    assert prompts(sorted_file, 4) == ["q0", "q1", "q3", "q5"]
    assert prompts(sorted_file, 3) == ["q0", "q3", "q5"]
    assert prompts(sorted_file, None) == prompts(sorted_file, 6) == [f"q{i}" for i in range(6)]
    assert prompts(write("plain.jsonl", [None] * 5), 3) == ["q0", "q1", "q2"]
    assert prompts(write("mixed.jsonl", ["a", "a", None, "b"]), 2) == ["q0", "q1"]
    _, mt_bench = read_prompts(str(PROMPTS / "mt_bench.jsonl"), 16)
    counts = {}
    for item in mt_bench:
        counts[item.record["category"]] = counts.get(item.record["category"], 0) + 1
    assert len(counts) == 8 and set(counts.values()) == {2}


def test_every_rendering_shows_the_per_category_rows():
    """Text, HTML and Markdown all show each category's runs, with the same numbers."""
    from dropmatch.bench import format_table
    from dropmatch.bench.report import _table, markdown_table

    def part(tau, speed):
        rule = dict(tau=tau, acceptance_rate=0.5, tokens_per_s=speed, speedup_vs_ar=speed / 20, speedup_vs_lossless=1.0,
                    mc_overhead=None, p=None, accuracy=None, target_nll=0.4, distinct2=0.6, overlap_with_lossless=1.0)
        return {"kind": "mt_bench", "prompts": 1, "skipped": [],
                "autoregressive": dict(tokens_per_s=20.0, accuracy=None, target_nll=0.4, distinct2=0.6),
                "rules": {"lossless": rule}}

    summary = {**part(1.5, 25.0), "prompts": 2, "categories": {"writing": part(1.2345, 21.0), "math": part(2.8765, 33.0)}}
    document = {"settings": {"command": "python -m dropmatch.bench ..."}, "benchmarks": {"mt_bench": summary}}
    for shown in (format_table("mt_bench", summary), _table(document), markdown_table(document)):
        for text in ("writing", "math", "1.23", "2.88", "1.05x", "1.65x"):
            assert text in shown


def test_text_html_and_markdown_tables_show_the_same_numbers_for_every_run():
    """The three renderings of a benchmark summary share one row builder: every run (AR, each rule,
    the peer) shows up in each, with the same tau / tokens/s / MC share strings."""
    from dropmatch.bench import format_table
    from dropmatch.bench.report import _table, markdown_table
    from dropmatch.bench.tables import summary_rows

    rule = dict(tau=2.1734, acceptance_rate=0.4, tokens_per_s=22.71, speedup_vs_ar=1.29, speedup_vs_lossless=1.0,
                mc_overhead=0.0381, p=0.057, accuracy=None, target_nll=0.378, distinct2=0.6,
                overlap_with_lossless=1.0)
    summary = {"kind": "gsm8k", "prompts": 2, "skipped": [],
               "autoregressive": dict(tokens_per_s=17.64, accuracy=0.5, target_nll=0.38, distinct2=0.6),
               "rules": {"lossless": {**rule, "mc_overhead": None, "p": None}, "dropmatch": rule},
               "peers": {"assisted": dict(name="transformers assisted generation", tokens_per_s=19.4,
                                          ours_over_peer=1.17)}}
    document = {"settings": {"command": "python -m dropmatch.bench ..."}, "benchmarks": {"gsm8k_test": summary}}
    text, page, markdown = format_table("gsm8k_test", summary), _table(document), markdown_table(document)
    rows = summary_rows(summary)
    assert [row[0] for row in rows] == ["autoregressive", "lossless", "dropmatch", "transformers assisted generation"]
    for shown in ("2.17", "22.7", "3.8%", "17.6", "ours/peer 1.17"):
        assert shown in page and shown in markdown
    for shown in ("2.17", "22.7", "3.8%", "17.6", "ours/peer = 1.17"):
        assert shown in text
    assert markdown.count("\n| ") == 1 + len(rows)  # the header, then one Markdown row per run


def test_the_mc_share_is_pooled_over_runs_as_a_ratio_of_sums():
    """Two runs: one with no MC time over many rounds, one all MC in one round. The pooled share is
    their MC time over their round time (a ratio of sums), not the mean of their two shares."""
    from dataclasses import replace

    from fake_engine import FakeEngine

    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end
    from dropmatch.metrics import mc_overhead

    engine = FakeEngine()
    trace = run_to_end(engine.speculative(engine.encode("a b c d e f g h i j"), DecodeConfig(gamma=2, max_new_tokens=10),
                                          RuleConfig("dropmatch", p=0.1)))
    assert len(trace.rounds) >= 3
    idle = replace(trace, t_calibration=0.0, rounds=tuple(replace(r, t_mc=0.0, t_round=1.0) for r in trace.rounds))
    busy = replace(trace, t_calibration=0.0, rounds=(replace(trace.rounds[0], t_mc=0.5, t_round=1.0),))
    assert mc_overhead(busy) == pytest.approx(0.5) and mc_overhead(idle) == 0.0
    assert mc_overhead(idle, busy) == pytest.approx(0.5 / (len(trace.rounds) + 1)), "not a ratio of sums"


def test_the_band_sees_repetition_and_every_run_reports_its_change_against_lossless():
    """A run whose NLL and nucleus are fine but whose text loops (distinct-2 well under the target's
    own samples') is outside the band, named by its axis; the deltas are the run minus lossless."""
    from dropmatch.bench.summary import band_checks, within_reference
    from dropmatch.metrics import MIN_DISTINCT2_SHARE
    from dropmatch.bench.tables import band_text

    reference = {"target_nll": 0.9, "off_nucleus_rate": 0.0, "distinct2": 0.8}
    fluent = {"target_nll": 0.7, "off_nucleus_rate": 0.005, "distinct2": 0.78}
    looping = {**fluent, "distinct2": 0.46}
    assert within_reference(fluent, reference) is True
    assert 0.46 < MIN_DISTINCT2_SHARE * 0.8 and within_reference(looping, reference) is False
    assert band_checks(looping, reference) == {"nll": True, "off_nucleus": True, "repetition": False}
    assert band_text(band_checks(looping, reference)) == "outside: repetition"
    assert band_text(band_checks({**looping, "target_nll": 1.0}, reference)) == "outside: nll, repetition"


def test_the_vllm_engine_gets_every_setting_of_the_command_it_was_started_with():
    """`dropmatch-bench --engine vllm` forwards prompts, limit, tokens, concurrency, rates, rule,
    repeats, rounds and the JSON path to the vLLM benchmark, whose parser takes them back."""
    from dropmatch.bench.cli import build_parser, vllm_bench_args
    from vllm_bench import parse_args as vllm_parse_args

    args = build_parser().parse_args([
        "--engine", "vllm", "--prompts", "a.jsonl,b.jsonl", "--limit", "8", "--max-new-tokens", "64",
        "--concurrency", "1,16", "--p-sweep", "0.1,0.2", "--rules", "lossless,dropmatch", "--repeats", "2",
        "--rounds", "3", "--json", "out.json"])
    forwarded = vllm_bench_args(args)
    assert dict(zip(forwarded[::2], forwarded[1::2])) == {
        "--prompts": "a.jsonl,b.jsonl", "--limit": "8", "--max-new-tokens": "64", "--concurrency": "1,16",
        "--p": "0.1,0.2", "--rule": "dropmatch", "--repeats": "2", "--rounds": "3", "--json": "out.json"}
    taken = vllm_parse_args(forwarded)
    assert (taken.limit, taken.concurrency, taken.p, taken.repeats, taken.rounds) == (8, [1, 16], [0.1, 0.2], 2, 3)
    bare = vllm_bench_args(build_parser().parse_args(["--engine", "vllm", "--prompts", "a.jsonl"]))
    assert "--repeats" not in bare and "--rounds" not in bare and "--limit" not in bare


def test_the_vllm_benchmark_refuses_a_missing_prompt_file_in_one_line_before_any_model_work(tmp_path, capsys,
                                                                                           monkeypatch):
    """A prompt file that is not there (the default dev set on a fresh checkout) stops the vLLM benchmark
    with one line naming it, exit 2, no traceback, and no model loaded or exported."""
    from dropmatch.models import loading
    import vllm_bench as bench

    monkeypatch.setattr(loading, "embedded_target_source", lambda: pytest.fail("a model was loaded"))
    monkeypatch.chdir(tmp_path)
    assert bench.main([]) == 2
    error = capsys.readouterr().err.strip()
    assert error == ("error: prompt file not found: runs/distill/dev.jsonl "
                     "(the dev prompts: python scripts/distill_draft.py devset)")
    assert bench.main(["--prompts", "elsewhere.jsonl"]) == 2
    assert capsys.readouterr().err.strip() == "error: prompt file not found: elsewhere.jsonl"


def test_the_judges_frontier_sweeps_its_threshold_inside_the_judges_own_score_range():
    """The shipped judge scores every mismatch in a narrow band (0.79-0.82): its frontier points take
    the judge's chosen threshold and its validation quantiles, never fixed values that accept nothing."""
    from dropmatch.decoding.acceptance import KNOBS
    from dropmatch.bench.running import variants, with_judge_knob
    from dropmatch.decoding.config import RuleConfig
    from dropmatch.decoding.trained_judge import SHIPPED_JUDGE, TrainedJudge

    judge = TrainedJudge.read(SHIPPED_JUDGE)
    runs = with_judge_knob(variants(["lossless"], RuleConfig(), [], frontier=True), judge)
    points = [run for run in runs if run.knob == "judge_threshold"]
    values = [run.value for run in points]
    assert judge.threshold in values and len(values) == 5 and len(set(run.label for run in runs)) == len(runs)
    assert all(min(judge.thresholds) <= value <= max(judge.thresholds) for value in values)
    assert not set(values) & set(KNOBS["judge_threshold"].sweep)
    assert all(run.rule.judge_threshold == run.value and run.rule.rule == "judge" for run in points)


def test_frontier_rules_limit_the_sweep_to_the_named_rules():
    from dropmatch.bench.running import variants
    from dropmatch.decoding.config import RuleConfig

    runs = variants(["lossless", "dropmatch"], RuleConfig(), [0.3], frontier=True, swept=("fly", "mars"))
    swept = {run.rule.rule for run in runs if run.knob is not None and run.label != "dropmatch@p=0.3"}
    assert swept == {"fly", "mars"}
    assert {run.rule.rule for run in variants(["lossless"], RuleConfig(), [], frontier=True) if run.knob} >= {
        "fly", "mars", "dropmatch", "typical"}


def band_result(temperature: float, own_distinct2: float, lossy_distinct2: float, samples_distinct2: float):
    """A one-prompt BenchmarkResult from the model-free engine: the target's own text (autoregressive and
    lossless SD) at one distinct-2, a lossy run at another, the target's samples at a third; every text's
    tokens at log-probability -0.5 under the target, in its nucleus."""
    from dataclasses import replace

    from fake_engine import FakeEngine

    from dropmatch.bench.prompts import Item
    from dropmatch.bench.running import BenchmarkResult, Generation
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end

    engine = FakeEngine()
    ids = engine.encode("a b c d e f g h")
    decode = DecodeConfig(gamma=3, max_new_tokens=8, temperature=temperature)

    def scored(trace):
        rounds = tuple(replace(r, emitted_logprob=(-0.5,) * len(r.emitted), emitted_in_nucleus=(True,) * len(r.emitted))
                       for r in trace.rounds)
        return replace(trace, first_logprob=-0.5, first_in_nucleus=True, rounds=rounds)

    def made(trace, distinct2):
        return Generation(scored(trace), 0.5, 0.0, distinct2)

    ar = run_to_end(engine.autoregressive(ids, decode))
    lossless = run_to_end(engine.speculative(ids, decode, RuleConfig("lossless")))
    lossy = run_to_end(engine.speculative(ids, decode, RuleConfig("dropmatch", p=0.3)))
    return BenchmarkResult("set", "plain", items=[Item("a b c d e f g h", {})], ar=[made(ar, own_distinct2)],
                           runs={"lossless": [made(lossless, own_distinct2)], "dropmatch": [made(lossy, lossy_distinct2)]},
                           reference=[[made(ar, samples_distinct2)]])


def test_under_greedy_lossless_sd_is_inside_the_band_and_a_loop_beyond_greedy_decodings_own_is_not():
    """Greedy: the repetition axis reads the target's own greedy text (lossless SD), so lossless SD is inside
    the band by construction however much greedy decoding repeats (here far below the samples' distinct-2),
    and a rule that loops more than it is outside. Sampled runs keep the samples as the yardstick."""
    from dropmatch.bench.summary import summarize_benchmark
    from dropmatch.bench.tables import GREEDY_YARDSTICK, SAMPLED_YARDSTICK

    greedy = summarize_benchmark(band_result(0.0, own_distinct2=0.4, lossy_distinct2=0.3, samples_distinct2=0.9))
    assert greedy["rules"]["lossless"]["band"] == {"nll": True, "off_nucleus": True, "repetition": True, "length": True}
    assert greedy["rules"]["lossless"]["within_reference"] is True
    assert greedy["rules"]["dropmatch"]["band"]["repetition"] is False  # 0.3 < 0.9 x 0.4
    assert greedy["reference"]["target_sampled"]["repetition_against"] == GREEDY_YARDSTICK
    sampled = summarize_benchmark(band_result(0.7, own_distinct2=0.4, lossy_distinct2=0.3, samples_distinct2=0.9))
    assert sampled["rules"]["lossless"]["band"]["repetition"] is False  # 0.4 < 0.9 x the samples' 0.9
    assert sampled["reference"]["target_sampled"]["repetition_against"] == SAMPLED_YARDSTICK


def test_task_scores_are_shown_only_where_lossless_sd_scores_above_zero():
    """A set where lossless SD scores 0: every run's task-score cell says why it is empty, in the text, HTML and
    Markdown tables; where lossless SD scores, the scores are shown."""
    from dropmatch.bench import format_table
    from dropmatch.bench.report import _table, markdown_table
    from dropmatch.bench.summary import task_score_note

    rule = dict(tau=2.0, acceptance_rate=0.5, tokens_per_s=20.0, speedup_vs_ar=1.2, speedup_vs_lossless=1.0,
                mc_overhead=None, p=None, accuracy=0.0, target_nll=0.4, distinct2=0.6, overlap_with_lossless=1.0)
    ar = dict(tokens_per_s=17.0, accuracy=0.0, target_nll=0.4, distinct2=0.6)
    rules = {"lossless": rule, "dropmatch": {**rule, "accuracy": 0.25}}
    summary = {"kind": "gsm8k", "prompts": 10, "skipped": [], "label": "GSM8K test, 10 of 100", "autoregressive": ar,
               "rules": rules, "task_score_note": task_score_note(rules, ar)}
    document = {"settings": {"command": "python -m dropmatch.bench ..."}, "benchmarks": {"gsm8k_test_100": summary}}
    for shown in (format_table("gsm8k_test_100", summary), _table(document), markdown_table(document)):
        assert shown.count("(lossless SD scores 0 here)") >= 3 and "0.250" not in shown  # AR, lossless, dropmatch
        assert "GSM8K test, 10 of 100" in shown
    scored = {"lossless": {**rule, "accuracy": 0.5}, "dropmatch": rules["dropmatch"]}
    assert task_score_note(scored, ar) is None
    assert "0.250" in markdown_table({**document, "benchmarks": {"gsm8k_test_100": {
        **summary, "rules": scored, "task_score_note": None}}})


def _frontier_document(date: str, points: list[tuple[str, float]], lossless_text: str = "same") -> dict:
    return {"settings": {"date": date, "command": f"run of {date}"},
            "prompts": {"gsm8k": [{"prompt": "q", "lossless": {"text": lossless_text}}]},
            "rules": {"lossless": {}, **{f"{rule}@{value}": {} for rule, value in points}},
            "frontier": [{"rule": rule, "value": value} for rule, value in points]}


def test_merged_frontier_takes_the_newer_runs_rules_and_drops_the_named_ones():
    sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))
    from merge_frontier import merged

    base = _frontier_document("old", [("dropmatch", 0.1), ("margin", 0.5), ("naive", 0.2)])
    newer = _frontier_document("new", [("mars", 0.9), ("ensemble", 0.5), ("dropmatch", 0.3)])
    base["settings"]["merged_from"] = [{"command": "older", "date": "older", "rules": "all"}]
    document = merged(base, newer, take=("mars", "ensemble"), drop=("margin",))
    assert base["settings"]["merged_from"][0]["rules"] == "all"  # the base document is left as it was
    assert document["settings"]["merged_from"][0]["rules"] == "all (now without ensemble, margin, mars)"
    assert [(point["rule"], point["value"], point["run"]) for point in document["frontier"]] == [
        ("dropmatch", 0.1, "old"), ("naive", 0.2, "old"), ("mars", 0.9, "new"), ("ensemble", 0.5, "new")]
    assert set(document["rules"]) == {"lossless", "dropmatch@0.1", "naive@0.2", "mars@0.9", "ensemble@0.5"}
    with pytest.raises(SystemExit, match="other tokens"):
        merged(base, _frontier_document("new", [("mars", 0.9)], lossless_text="other"), take=("mars",))
