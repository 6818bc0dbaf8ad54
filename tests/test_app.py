"""The Gradio app on a fake engine: launched in-process, driven through gradio_client."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine
from local_server import serve_locally

from dropmatch.decoding.config import PairSpec
from dropmatch.pair_host import DEFAULT_PRESET, Policy, PairHost, pair_from_choice
from tools.visitors import api_client

PROMPT = "alpha beta gamma delta epsilon zeta eta theta"


def fake_studio(**engine_kwargs) -> PairHost:
    return PairHost(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine(**engine_kwargs))


@pytest.fixture(scope="module")
def running_app():
    import app

    demo = app.create_demo(fake_studio())
    serve_locally(demo)
    try:
        yield api_client(demo.local_url)
    finally:
        demo.close()


def test_compare_endpoint_needs_only_a_prompt(running_app):
    """/compare with prompt= alone returns both texts, both metric sets and every figure."""
    result = running_app.predict(prompt=PROMPT, api_name="/compare")
    assert result["lossless"]["text"] == PROMPT
    assert result["lossy"]["text"] == PROMPT
    assert result["rule"] == "dropmatch"
    for side in ("lossless", "lossy"):
        metrics = result[side]["metrics"]
        assert metrics["tau"] > 1.0 and 0.0 < metrics["acceptance_rate"] <= 1.0
        # vs the target alone is over transformers' generate(), which a model-free engine has not got (the tiny
        # models' run: test_stopwatch.test_the_apps_speed_against_the_target_alone_reads_generates_rate)
        assert metrics["speedup_vs_ar"] is None
    # the API reports the engine's own numbers: the same as summarising the engine's runs directly
    from dropmatch.compare import compare_stream
    from dropmatch.decoding.config import Settings
    from dropmatch.metrics import summarize

    decode, rule = Settings(PROMPT).parse()
    *_, state = compare_stream(FakeEngine(), PROMPT, decode, rule)
    for side, trace in (("lossless", state.lossless.trace), ("lossy", state.lossy.trace)):
        direct = summarize(trace)
        for key in ("tau", "acceptance_rate", "rounds", "drafted", "accepted", "lossy_share"):
            assert result[side]["metrics"][key] == pytest.approx(getattr(direct, key)), f"{side} {key}"
    assert result["lossy"]["metrics"]["mc_overhead"] is not None
    assert set(result["figures"]) == {"agreement", "js", "acceptance", "tokens_vs_calls"}
    for name, figure in result["figures"].items():
        assert figure["data"], f"figure {name} is empty"
    heatmap = result["figures"]["agreement"]["data"][0]
    assert heatmap["type"] == "heatmap" and len(heatmap["y"]) == 5 + 2


def test_compare_endpoint_takes_every_setting(running_app):
    result = running_app.predict(prompt=PROMPT, gamma="3", rule="majority", k=7, p="0.2", temperature=0.0,
                                 top_p=0.9, max_new_tokens=5, seed=3, run_autoregressive=False,
                                 draft_source="ngram", api_name="/compare")
    assert result["rule"] == "majority"
    assert result["lossy"]["p"] == 0.2
    assert result["lossless"]["text"] == " ".join(PROMPT.split()[:5])
    assert result["autoregressive"] is None
    assert result["lossy"]["metrics"]["speedup_vs_ar"] is None


@pytest.mark.parametrize("bad, message", [
    (dict(prompt="   "), "prompt is empty"),
    (dict(prompt=PROMPT, gamma="0"), "gamma"),
    (dict(prompt=PROMPT, gamma="often"), "gamma"),
    (dict(prompt=PROMPT, draft_source="oracle"), "draft source"),
    (dict(prompt=PROMPT, k=0), "K"),
    (dict(prompt=PROMPT, p="1.5"), "dropout rate"),
    (dict(prompt=PROMPT, p="lots"), "dropout rate"),
    (dict(prompt=PROMPT, temperature="hot"), "temperature"),
    (dict(prompt=PROMPT, max_new_tokens=10**9), "max new tokens"),
    (dict(prompt=PROMPT, rule="telepathy"), "unknown rule"),
    (dict(prompt=PROMPT, pair="Custom hub ids", target_id="", draft_id="x"), "model id is empty"),
])
def test_bad_input_gets_one_clear_message(running_app, bad, message):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match=message):
        running_app.predict(**bad, api_name="/compare")


def test_ui_endpoints_are_not_public_api(running_app):
    endpoints = running_app.view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert "/compare" in endpoints


def test_allow_list_refuses_other_models():
    policy = Policy.from_env({"DROPMATCH_ALLOWED_MODELS": "org/a, org/b"})
    assert policy.check(PairSpec("org/a", "org/b")).target == "org/a"
    with pytest.raises(ValueError, match="not on this server's list"):
        policy.check(PairSpec("org/a", "evil/c"))


def test_trust_remote_code_is_off_unless_the_environment_turns_it_on():
    assert Policy.from_env({}).check(PairSpec("org/a", "org/b")).trust_remote_code is False
    assert Policy.from_env({"DROPMATCH_TRUST_REMOTE_CODE": "1"}).check(PairSpec("org/a", "org/b")).trust_remote_code


def test_presets_name_the_embedded_pair_first():
    assert pair_from_choice(DEFAULT_PRESET) == PairSpec()


@pytest.mark.slow  # a server or subprocess: the full suite's, not the fast tier's
def test_importing_the_app_loads_no_model():
    """Nothing heavy at import time: importing app.py pulls in neither transformers nor torch models."""
    import subprocess
    import sys

    code = "import sys, app; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_app_answers_on_its_address_before_the_default_pair_starts_loading(monkeypatch):
    """`python app.py` launches, and only then starts loading the embedded pair: Gradio's launch
    probes its own address and gives up on one HEAD over 3 s, which a slow CPU converting the GGUF
    in the background can make it take."""
    import sys

    import gradio
    import httpx
    from space_helpers import free_port

    import app

    port = free_port()
    monkeypatch.setattr(sys, "argv", ["app.py", "--port", str(port)])
    answered = []
    monkeypatch.setattr(PairHost, "preload", lambda self, spec: answered.append(
        httpx.head(f"http://127.0.0.1:{port}/", timeout=30).status_code))
    monkeypatch.setattr(gradio.Blocks, "block_thread", lambda self: self.close())
    app.main()
    assert answered == [200]


def test_downloads_stay_in_one_folder_that_keeps_only_the_newest_runs(tmp_path):
    """Every run writes its trace and metrics into the server's one folder; old runs are removed."""
    import json as json_module

    from fake_engine import FakeEngine

    from dropmatch.compare import compare_stream
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.runfile import Downloads, record_of

    engine = FakeEngine()
    downloads = Downloads(tmp_path / "downloads", keep=3)
    for i in range(5):
        *_, state = compare_stream(engine, f"{PROMPT} {i}", DecodeConfig(max_new_tokens=6), RuleConfig("dropmatch"))
        trace_path, metrics_path = downloads.write(record_of(state, engine))
    runs = [p for p in (tmp_path / "downloads").iterdir()]
    assert len(runs) == 3 and all(p.is_dir() for p in runs)
    saved = json_module.loads(open(trace_path).read())
    assert saved["lossy"]["rule"] == "dropmatch" and saved["tokens"]
    assert open(metrics_path).read().startswith("label,")
    downloads.close()
    assert not (tmp_path / "downloads").exists()


def test_the_run_state_holds_data_only_so_switching_pairs_frees_the_old_engine():
    """gr.State keeps a RunRecord (traces and token texts, no engine); a Studio that switches pairs
    drops every reference to the previous engine."""
    import gc
    import weakref

    from fake_engine import FakeEngine

    from dropmatch.compare import compare_stream
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.runfile import record_of

    studio = PairHost(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine())
    first = studio.engine(PairSpec("org/a", "org/b"))
    *_, state = compare_stream(first, PROMPT, DecodeConfig(max_new_tokens=6), RuleConfig("dropmatch"))
    record = record_of(state, first)
    assert record.token_text(state.lossless.trace.output_ids[0]) == first.token_text(state.lossless.trace.output_ids[0])
    gone = weakref.ref(first)
    del first, state
    studio.engine(PairSpec("org/c", "org/d"))
    gc.collect()
    assert gone() is None
    assert "engine" not in repr(vars(record)).lower()


def test_the_web_app_loads_hub_ids_only_unless_local_models_are_allowed(tmp_path, monkeypatch):
    """A local folder (or anything not namespace/name) is refused by default; the environment can allow it."""
    from dropmatch.decoding.config import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)  # a local folder that looks like a hub id
    policy = Policy.from_env({})
    assert policy.check(PairSpec("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"))
    for name in ("/etc", "../secret/model", str(tmp_path), "org/model", "model"):
        with pytest.raises(ConfigError, match="not a hub id"):
            policy.check(PairSpec(name, "org/b"))
    allowing = Policy.from_env({"DROPMATCH_ALLOW_LOCAL_MODELS": "1"})
    assert allowing.check(PairSpec(str(tmp_path), "org/model")).target == str(tmp_path)


def test_a_recorded_run_opens_with_no_model_and_a_foreign_file_gets_one_message(tmp_path):
    """The Downloads trace of a run reopens (both columns, stats, charts, step view) with a Studio
    whose loader fails; an old or foreign JSON gets one clear line."""
    import json as json_module

    from fake_engine import FakeEngine

    from dropmatch.compare import compare_stream
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.runfile import Downloads, record_of
    from dropmatch.ui.callbacks import open_recorded

    engine = FakeEngine()
    *_, state = compare_stream(engine, PROMPT, DecodeConfig(max_new_tokens=8), RuleConfig("dropmatch"))
    downloads = Downloads(tmp_path / "downloads")
    trace_path, _ = downloads.write(record_of(state, engine))

    view = open_recorded(downloads, trace_path, "a run")
    assert view["status"].startswith("Showing a **recorded run**, *a run*")
    assert "alpha" in view["lossless_out"] and "alpha" in view["lossy_out"] and "tau" in view["lossy_stats"]
    assert view["plot_agreement"].data and "Round 0" in view["step_out"]
    assert view["last_run"].lossy.output_ids == state.lossy.trace.output_ids

    old = json_module.loads(open(trace_path).read())
    for name, content, message in (
        ("foreign.json", json_module.dumps({"hello": 1}), "not a DropMatch Studio run"),
        ("old.json", json_module.dumps({**old, "version": 0}), "format version 0"),
        ("broken.json", "{not json", "not readable JSON"),
        ("damaged.json", json_module.dumps({**old, "lossy": {}}), "damaged"),
    ):
        (tmp_path / name).write_text(content)
        shown = open_recorded(downloads, tmp_path / name)
        assert set(shown) == {"status"} and message in shown["status"] and "\n" not in shown["status"]


def test_shipped_recorded_runs_open_while_loading_fails():
    """Every run in assets/recorded opens with no model (the Studio's loader would raise): columns,
    charts and the rule lab's matrix at the run's own settings; moving a lab control then says which
    pair's heads it needs instead of failing."""
    from dropmatch.runfile import Downloads, recorded_runs
    from dropmatch.ui.callbacks import open_recorded, reverify_view

    def no_model(spec):
        raise RuntimeError("no model may load in this test")

    studio = PairHost(loader=no_model, engine_factory=lambda pair: pair)
    shipped = recorded_runs()
    assert len(shipped) >= 3
    for title, path in shipped.items():
        view = open_recorded(Downloads(), path, title)
        assert view["status"].startswith("Showing a **recorded run**") and view["lossless_out"] and view["plot_js"] is not None
        assert "<table>" in view["lab_out"] and "tau on these drafts" in view["lab_summary"]
        assert view["lab_p"] == view["last_run"].lossy.p  # the controls start at the run's own settings
        moved = reverify_view(studio, view["last_run"], {"num_paths": 5, "p": 0.2, "majority_fraction": 0.8, "centroid": "probs", "fixed_js_threshold": 0.1, "typical_eps": 0.3})
        assert "not in memory" in moved["lab_status"] and "lab_out" not in moved
    assert not studio.is_loaded(PairSpec())


def test_on_a_space_pairs_are_the_presets_and_runs_are_capped_unless_configured():
    """SPACE_ID set: a hub id outside the presets is refused and more than 512 tokens through the API
    too; the environment can widen both; off a Space neither applies."""
    from dropmatch.decoding.config import ConfigError

    space = Policy.from_env({"SPACE_ID": "user/dropmatch"})
    assert space.check(PairSpec("Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B")).target == "Qwen/Qwen3-8B"
    with pytest.raises(ConfigError, match="not on this server's list"):
        space.check(PairSpec("org/big", "org/small"))
    with pytest.raises(ConfigError, match="at most 512 new tokens"):
        space.check_length(100_000)
    space.check_length(512)
    wide = Policy.from_env({"SPACE_ID": "user/dropmatch", "DROPMATCH_ALLOWED_MODELS": "org/big,org/small",
                            "DROPMATCH_MAX_NEW_TOKENS": "2048"})
    assert wide.check(PairSpec("org/big", "org/small")).target == "org/big"
    wide.check_length(2048)
    local = Policy.from_env({})
    local.check(PairSpec("org/big", "org/small"))
    local.check_length(100_000)


def test_the_api_refuses_a_run_longer_than_the_servers_cap():
    from dropmatch.decoding.config import Settings
    from dropmatch.ui.callbacks import compare_api

    studio = PairHost(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine(),
                    policy=Policy(max_new_tokens=8))
    with pytest.raises(Exception, match="at most 8 new tokens"):
        list(compare_api(studio, Settings(PROMPT, max_new_tokens=9)))
    *_, result = compare_api(studio, Settings(PROMPT, max_new_tokens=8))
    assert result["lossy"]["text"]


def test_model_work_is_one_group_of_one_and_cheap_events_are_not_queued_behind_it():
    """Runs, the lab's re-judge and /compare share the concurrency group "engine" with a limit of 1;
    every other event (page load, a recorded run, the step slider, the timer) runs beside them."""
    import app

    demo = app.create_demo(fake_studio())
    heavy = {"on_run", "on_lab", "compare"}
    names = set()
    for fn in demo.fns.values():
        names.add(fn.name)
        if fn.name in heavy:
            assert (fn.concurrency_id, fn.concurrency_limit) == ("engine", 1), fn.name
        else:
            assert fn.concurrency_id != "engine" and fn.concurrency_limit in ("default", None) or \
                fn.concurrency_limit > 1, fn.name
    assert heavy <= names and {"on_first_visit", "step_view", "on_recorded_choice"} <= names
    assert demo._queue.default_concurrency_limit > 1


SPLIT_TEXTS = ("مرحبا بالعالم، كيف حالك؟", "你好，世界。今天天气很好", "party 🎉👍🏽 time 🧑‍🚀")


@pytest.fixture(scope="module")
def embedded_services():
    """PairServices over the embedded pair's own tokenizer (byte-level BPE, offline), without its models."""
    import os
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from dropmatch.models.loading import embedded_target_source
    from dropmatch.decoding.pair_services import PairServices

    os.environ["HF_HUB_OFFLINE"] = "1"
    tokenizer = AutoTokenizer.from_pretrained(embedded_target_source()[0])
    return PairServices(SimpleNamespace(target=None, draft=None, tokenizer=tokenizer, source="embedded", spec=None))


@pytest.mark.slow
@pytest.mark.parametrize("text", SPLIT_TEXTS, ids=("arabic", "cjk", "emoji"))
def test_columns_show_characters_split_across_tokens_whole(embedded_services, text):
    """Arabic, CJK and emoji answers: a running column and a finished run's column hold no U+FFFD, and read as the text."""
    import html as html_lib
    import re
    from types import SimpleNamespace

    from dropmatch.compare import Column
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.runfile import RunRecord
    from dropmatch.decoding.trace import GenerationTrace, RoundTrace
    from dropmatch.ui import views

    ids = embedded_services.tokenizer(text)["input_ids"]
    assert any("\ufffd" in embedded_services.tokenizer.decode([t]) for t in ids)  # the tokenizer does split characters
    rounds = [RoundTrace(i, ids[i], (), (t,), "target", 0, 0.0, 0.01, 0.002, 0.0, 0.012, 1) for i, t in enumerate(ids[1:])]
    engine = SimpleNamespace(services=embedded_services, stop_ids=frozenset())
    running = views.column_html(Column("lossless", rounds), engine, DecodeConfig(), RuleConfig("lossless"))
    trace = GenerationTrace("ar", "autoregressive", None, DecodeConfig(), RuleConfig("lossless"), (1,), ids[0],
                            tuple(rounds), tuple(ids), embedded_services.stream_texts(ids), text, "max_new_tokens", 0.1, 0.2)
    record = RunRecord(text, "dropmatch", False, trace, trace, None, {t: embedded_services.token_text(t) for t in ids})
    for column in (running, views.trace_html(trace, record)):
        shown = html_lib.unescape("".join(re.findall(r'<span class="dm-tok[^"]*"[^>]*>([^<]*)</span>', column)))
        assert "\ufffd" not in column and shown == text


def _shown_bytes(shown: str) -> bytes:
    """A token's shown text read back as bytes: each "<0xD8>" one byte, the rest UTF-8."""
    import re

    parts = re.split(r"(<0x[0-9A-F]{2}>)", shown)
    return b"".join(bytes.fromhex(part[3:5]) if re.fullmatch(r"<0x[0-9A-F]{2}>", part) else part.encode() for part in parts)


@pytest.mark.slow
def test_a_token_that_is_part_of_a_character_shows_its_bytes_not_u_fffd(embedded_services):
    """Popovers, the step view and the rule lab show one token at a time: a token holding part of an Arabic, CJK or
    emoji character shows its bytes ("<0xD8>"), never U+FFFD, and the tokens' bytes join to the text's own."""
    tokenizer = embedded_services.tokenizer
    for text in SPLIT_TEXTS:
        shown = [embedded_services.token_text(t) for t in tokenizer(text)["input_ids"]]
        assert not any("\ufffd" in piece for piece in shown), shown
        assert b"".join(map(_shown_bytes, shown)) == text.encode("utf-8"), shown
    broken = [t for t in range(tokenizer.vocab_size) if "\ufffd" in tokenizer.decode([t])]
    assert len(broken) > 100  # byte tokens of the embedded tokenizer
    for token in broken:  # the same bytes as the tokenizer's own reading; U+FFFD only where the token is that character
        raw = _shown_bytes(embedded_services.token_text(token))
        assert raw.decode("utf-8", errors="replace") == tokenizer.decode([token])
        assert ("\ufffd" in embedded_services.token_text(token)) == ("\ufffd".encode() in raw)


def test_a_long_prompts_reading_time_comes_from_a_prompt_this_engine_read(tiny_engine):
    """After a run, the notice's seconds are that run's measured prefill rate, not a per-position verify cost."""
    from dropmatch.decoding.config import DecodeConfig, RuleConfig
    from dropmatch.decoding.engine import run_to_end
    from dropmatch.ui.views import prompt_note

    ids = [(7 * i + 3) % 200 for i in range(300)]
    run_to_end(tiny_engine.speculative(ids, DecodeConfig(gamma=2, max_new_tokens=4), RuleConfig("lossless")))
    tokens, seconds = tiny_engine.services.prefill
    assert tokens >= 300 and seconds > 0
    long_prompt = " ".join(["word"] * 1500)
    expected = seconds * len(tiny_engine.encode(long_prompt)) / tokens
    assert f"≈ {expected:.{0 if expected >= 10 else 1}f} s per run" in prompt_note(long_prompt, tiny_engine)


def test_the_ensemble_at_temperature_0_runs_its_transformers_peer_greedy(tiny_engine):
    """Greedy settings run transformers' static ensemble greedy too: no raw "strictly positive float" error."""
    from dropmatch.compare import compare_stream
    from dropmatch.decoding.config import DecodeConfig, RuleConfig

    *_, state = compare_stream(tiny_engine, "what is two plus three?", DecodeConfig(gamma=3, max_new_tokens=8),
                               RuleConfig("ensemble"), run_ar=False)
    assert state.phase == "done" and state.peer["tokens"] > 0


def test_a_recorded_runs_settings_put_back_in_the_controls_parse_to_its_own():
    """Each shipped run's prompt, rule and settings, as the controls would hold them, parse to the run's own configs."""
    from dropmatch.decoding.config import DEFAULTS, Settings
    from dropmatch.runfile import read_recorded_run, recorded_runs
    from dropmatch.ui.views import settings_view

    assert recorded_runs()
    for title, path in recorded_runs().items():
        record = read_recorded_run(path)
        view = settings_view(record)
        decode, rule = Settings(**{**DEFAULTS.as_arguments(), **view}).parse()
        assert view["prompt"] == record.prompt and view["rule"] == record.rule, title
        assert decode == record.lossy.decode_config, title
        assert rule == record.lossy.rule_config, title


def _lab(colour: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB "#rrggbb"."""
    linear = [(c / 255) for c in bytes.fromhex(colour[1:])]
    r, g, b = [((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92 for c in linear]
    xyz = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    x, y, z = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz]
    return 116 * y - 16, 500 * (x - y), 200 * (y - z)


def test_every_rule_and_the_runs_star_wear_colours_told_apart_in_trade_offs():
    """No two rules' lines, nor a rule and this run's star, share a colour (CIE76 distance at least 20)."""
    import itertools
    import math

    from dropmatch.decoding.acceptance import RULES
    from dropmatch.plots import RUN_STAR

    from dropmatch.rule_words import RULE_WORDS

    colours = {name: RULE_WORDS[name].colour for name in RULES} | {"this run's star": RUN_STAR["color"]}
    for (a, first), (b, second) in itertools.combinations(colours.items(), 2):
        assert math.dist(_lab(first), _lab(second)) >= 20, (a, first, b, second)
