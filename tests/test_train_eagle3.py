"""The EAGLE-3 head's training script (scripts/train_eagle3.py): its training-time test computes, at every
position and step, what the loaded head computes when it drafts a chain there; a short run on a tiny target
trains, resumes and exports a head in the authors' format that the Studio loads."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import train_eagle3
from dropmatch.decoding import eagle3
from tiny_models import make_llama, save_eagle3_head
from tools.generation import save_generated

LAYERS = (0, 1, 1)


@pytest.fixture(scope="module")
def target():
    return make_llama(vocab_size=64, seed=3)


def test_the_training_time_test_is_the_chain_the_loaded_head_drafts(target, tmp_path):
    """Step i at position j of the authors' training-time test equals the i-th step of a round that read the
    target up to j and then its own outputs, with the text's next tokens (the loaded head's cache and rotary
    positions): training and drafting are one computation."""
    from dropmatch.decoding.causal_lm import CausalLM

    folder = save_eagle3_head(tmp_path, target, list(range(0, 64, 2)), LAYERS, sharpness=1.0)
    head = eagle3.load_head(folder, CausalLM(target, "tiny", 64))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (16,), generator=generator)
    features = torch.randn(16, 3 * target.config.hidden_size, generator=generator)
    with torch.no_grad():
        embedding = getattr(head.module, "embed_tokens", None) or target.get_input_embeddings()
        steps = train_eagle3.ttt_steps(head.module, embedding, ids[None], features[None])
    assert len(steps) == train_eagle3.STEPS
    for j in (0, 3, 8):
        cache = head.new_cache()
        out = head.step(features[: j + 1], ids[1 : j + 2], cache, fuse=True)[-1:]
        for i in range(train_eagle3.STEPS):
            torch.testing.assert_close(steps[i][0, j], out[0], rtol=1e-4, atol=1e-5)
            if i + 1 < train_eagle3.STEPS:
                out = head.step(out, ids[j + 2 + i : j + 3 + i], cache, fuse=False)


def test_each_steps_loss_reads_the_label_and_mask_the_authors_align_with_it(target):
    """ttt_losses (shifted tensors) against the alignment written out position by position: step i at position j
    is labelled by the target's softmax at j + 1 + i over the draft vocabulary, counted where the loss mask holds at
    j + i, the target's argmax at j + 1 + i is in the draft vocabulary, and the label is not past the answer's end."""
    generator = torch.Generator().manual_seed(1)
    hidden, width, vocab = target.config.hidden_size, 20, 64
    used = torch.arange(0, vocab, 2)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    spec = train_eagle3.head_spec(target.config, LAYERS, len(used))
    module = eagle3.HeadModule(spec, len(LAYERS))
    lengths = (20, 14)
    batch = {"ids": torch.randint(0, vocab, (2, width), generator=generator),
             "top": torch.randint(0, vocab, (2, width), generator=generator),
             "features": torch.randn(2, width, 3 * hidden, generator=generator),
             "head_in": torch.randn(2, width, hidden, generator=generator),
             "loss_mask": torch.zeros(2, width)}
    for b, length in enumerate(lengths):
        batch["loss_mask"][b, 6:length] = 1  # the answer: positions 6 .. length - 1
        batch["head_in"][b, length:] = 0  # right padding, as batch_of leaves it
        batch["top"][b, length:] = 0
    head_rows = torch.randn(len(used), hidden, generator=generator)
    embedding = target.get_input_embeddings()
    with torch.no_grad():
        losses, _ = train_eagle3.ttt_losses(module, embedding, head_rows, t2d, batch)
        steps = train_eagle3.ttt_steps(module, embedding, batch["ids"], batch["features"])
    for i, out in enumerate(steps):
        with torch.no_grad():
            log_q = torch.log_softmax(module.lm_head(module.norm(out)).float(), -1)
        total = torch.zeros(())
        for b, length in enumerate(lengths):
            for j in range(width):
                label_at = j + 1 + i
                if label_at >= length or not batch["loss_mask"][b, j + i] or not t2d[batch["top"][b, label_at]]:
                    continue
                label = torch.softmax(batch["head_in"][b, label_at] @ head_rows.T, -1)
                total = total - (label * log_q[b, j]).sum()
        torch.testing.assert_close(losses[i], total / (2 * width), rtol=1e-5, atol=1e-6)


def test_a_short_run_trains_resumes_and_exports_a_head_the_studio_loads(target, tmp_path):
    """Greedy answers of the tiny target, two runs of a few steps (the second resumes the first), then export:
    the folder has the authors' keys, the draft vocabulary is the answers' most frequent tokens, the recipe has
    the held-out curve, and eagle3.load_head binds it to the target."""
    from dropmatch.decoding.causal_lm import CausalLM

    records = []
    for seed in range(12):
        prompt = torch.randint(0, 64, (5,), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            answer = target.generate(prompt[None], max_new_tokens=10, do_sample=False)[0, 5:]
        records.append({"ids": torch.cat([prompt, answer]).int(), "prompt_len": 5, "source": "test"})
    save_generated(tmp_path / "generated.npz", records, [{"answers": len(records)}])
    args = argparse.Namespace(work=str(tmp_path), train_minutes=0.0, steps=3, draft_vocab=24, batch=4, max_len=64,
                              lr=1e-3, warmup=2, eval_every=3, held_out=3, seed=0, layers="0,1,1", device="cpu", out=str(tmp_path / "head"))
    train_eagle3.train(args, target)
    first = torch.load(tmp_path / "eagle3_state.pt", weights_only=False)["state"]
    args.steps = 6
    train_eagle3.train(args, target)
    state = torch.load(tmp_path / "eagle3_state.pt", weights_only=False)["state"]
    assert first["step"] == 3 and state["step"] == 6 and [row[0] for row in state["history"]] == [3, 6]
    train_eagle3.export(args, target)
    saved = json.loads((tmp_path / "head" / "config.json").read_text())
    assert saved["draft_vocab_size"] == 24 and saved["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 1]
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "head" / "model.safetensors")))
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.self_attn.q_proj.weight"} <= keys
    recipe = json.loads((tmp_path / "head" / "recipe.json").read_text())
    assert len(recipe["curve"]) == train_eagle3.STEPS and all(0 <= a <= 1 for a in recipe["curve"])
    head = eagle3.load_head(tmp_path / "head", CausalLM(target, "tiny", 64))
    answered = set(torch.cat([r["ids"][5:].long() for r in records]).tolist())
    assert set(head.target_ids.tolist()) <= answered and len(head.target_ids) == min(24, len(answered))
