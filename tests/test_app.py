"""The Gradio app on a fake engine: launched in-process, driven through gradio_client."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine

from dropmatch.config import PairSpec
from dropmatch.studio import DEFAULT_PRESET, Policy, Studio, pair_from_choice

PROMPT = "alpha beta gamma delta epsilon zeta eta theta"


def fake_studio(**engine_kwargs) -> Studio:
    return Studio(loader=lambda spec: spec, engine_factory=lambda pair: FakeEngine(**engine_kwargs))


@pytest.fixture(scope="module")
def running_app():
    from gradio_client import Client

    import app

    demo = app.create_demo(fake_studio())
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True)
    try:
        yield Client(demo.local_url, verbose=False)
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
        assert metrics["speedup_vs_ar"] is not None
    assert result["lossy"]["metrics"]["tau"] > result["lossless"]["metrics"]["tau"]
    assert result["lossy"]["metrics"]["mc_overhead"] is not None
    assert set(result["figures"]) == {"agreement", "js", "acceptance", "tokens_vs_calls"}
    for name, figure in result["figures"].items():
        assert figure["data"], f"figure {name} is empty"
    heatmap = result["figures"]["agreement"]["data"][0]
    assert heatmap["type"] == "heatmap" and len(heatmap["y"]) == 5 + 2


def test_compare_endpoint_takes_every_setting(running_app):
    result = running_app.predict(prompt=PROMPT, gamma=3, rule="majority", k=7, p="0.2", temperature=0.0,
                                 top_p=0.9, max_new_tokens=5, seed=3, run_autoregressive=False,
                                 api_name="/compare")
    assert result["rule"] == "majority"
    assert result["lossy"]["p"] == 0.2
    assert result["lossless"]["text"] == " ".join(PROMPT.split()[:5])
    assert result["autoregressive"] is None
    assert result["lossy"]["metrics"]["speedup_vs_ar"] is None


@pytest.mark.parametrize("bad, message", [
    (dict(prompt="   "), "prompt is empty"),
    (dict(prompt=PROMPT, gamma=0), "gamma"),
    (dict(prompt=PROMPT, k=0), "K"),
    (dict(prompt=PROMPT, p="1.5"), "dropout rate"),
    (dict(prompt=PROMPT, p="lots"), "dropout rate"),
    (dict(prompt=PROMPT, temperature="hot"), "temperature"),
    (dict(prompt=PROMPT, max_new_tokens=10**9), "max new tokens"),
    (dict(prompt=PROMPT, rule="telepathy"), "unknown rule"),
    (dict(prompt=PROMPT, draft_confidence=1.5), "draft confidence"),
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


def test_importing_the_app_loads_no_model():
    """Nothing heavy at import time: importing app.py pulls in neither transformers nor torch models."""
    import subprocess
    import sys

    code = "import sys, app; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
