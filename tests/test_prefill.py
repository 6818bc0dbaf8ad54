"""A long prompt's reading (the prefill) followed piece by piece: the same numbers as one pass, and the
status line says how far it got while the page waits for the first round."""

from __future__ import annotations

import time

import torch
from fake_engine import FakeEngine

from dropmatch.decoding.config import DecodeConfig, RuleConfig, Settings
from dropmatch.decoding.engine import run_to_end

LONG = 900  # prompt tokens: two pieces of PREFILL_CHUNK and a rest, inside the tiny pair's context


def _tiny_target(tiny_dirs):
    from transformers import AutoModelForCausalLM

    from dropmatch.decoding.causal_lm import CausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[0], dtype=torch.float32)
    return CausalLM(model, "tiny", model.config.vocab_size)


def test_a_prompt_read_in_pieces_gives_the_hidden_states_and_cache_of_one_pass(tiny_dirs):
    """With progress, a CPU model reads 1300 rows in pieces of 512, says each, and ends where one pass does."""
    lm = _tiny_target(tiny_dirs)
    ids = torch.randint(0, lm.vocab_size, (1300,), generator=torch.Generator().manual_seed(3))
    said = []
    whole_cache, pieces_cache = lm.new_cache(), lm.new_cache()
    whole = lm.hidden(ids, whole_cache)
    pieces = lm.hidden(ids, pieces_cache, progress=lambda done, total: said.append((done, total)))
    assert said == [(512, 1300), (1024, 1300), (1300, 1300)]
    assert torch.equal(pieces, whole)
    assert torch.equal(pieces_cache.layers[0].keys, whole_cache.layers[0].keys)


def test_a_run_that_reports_its_reading_emits_the_same_tokens(tiny_engine):
    """The same prompt, seed and rule, with and without progress: the same tokens, rounds and decisions."""
    words = tiny_engine.encode("the quick brown fox jumps over the lazy dog")
    ids = (words * LONG)[:LONG]
    decode, rule = DecodeConfig(gamma=4, max_new_tokens=12), RuleConfig("dropmatch", p=0.3)
    said = []
    plain = run_to_end(tiny_engine.speculative(ids, decode, rule))
    followed = run_to_end(tiny_engine.speculative(ids, decode, rule, progress=lambda *read: said.append(read)))
    assert said[-1] == (len(ids), len(ids)) and len(said) >= 2
    assert followed.output_ids == plain.output_ids
    assert [[d.reason for d in r.drafted] for r in followed.rounds] == [[d.reason for d in r.drafted] for r in plain.rounds]


class SlowReader(FakeEngine):
    """A fake pair whose target takes its time over a prompt, saying how far it read (as Engine does)."""

    def speculative(self, prompt_ids, decode, rule, stop_event=None, keep_states=False, progress=None):
        for done in range(256, len(prompt_ids), 256):
            time.sleep(0.3)
            if progress is not None:
                progress(done, len(prompt_ids))
        return (yield from super().speculative(prompt_ids, decode, rule, stop_event, keep_states, progress))


def test_the_status_says_how_far_a_long_prompt_is_read_then_running_again(tmp_path):
    """While each column's target reads a 1024-token prompt the status line counts the tokens read; the
    first round after it says "Running" again, and the run ends Done."""
    from dropmatch.runfile import Downloads
    from dropmatch.pair_host import PairHost
    from dropmatch.ui.callbacks import run_comparison

    studio = PairHost(loader=lambda spec: spec, engine_factory=lambda pair: SlowReader())
    prompt = " ".join(f"w{i}" for i in range(1024))
    try:
        statuses = [view["status"] for view in run_comparison(studio, Downloads(tmp_path), Settings(prompt=prompt, max_new_tokens=8))
                    if "status" in view]
    finally:
        studio.close()
    reading = [s for s in statuses if s.startswith("Reading the prompt")]
    assert any("for lossless SD: " in s and "of 1,024 tokens" in s for s in reading), statuses
    assert any("for DropMatch (JS, then majority): " in s for s in reading), statuses
    first = statuses.index(reading[0])
    assert "Running …" in statuses[first:], statuses
    assert statuses[-1].startswith("Done"), statuses
