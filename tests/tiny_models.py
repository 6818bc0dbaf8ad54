"""Tiny causal LMs and a tiny tokenizer, built and saved locally by the tests (no network)."""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "speculative decoding drafts tokens and verifies them in one pass",
    "what is two plus three? two plus three is five.",
    "write a poem about the sea and the moon",
] * 20


def save_tokenizer(path: Path, vocab_size: int = 200):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return tokenizer


def make_llama(vocab_size: int, seed: int, layers: int = 2, hidden: int = 32, scale: float = 0.4):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=scale, tie_word_embeddings=False, eos_token_id=2, bos_token_id=1, pad_token_id=0,
    )
    model = LlamaForCausalLM(config)
    # Sharp, well-separated logits: random near-ties would make greedy choices depend on
    # summation order, which is not what the tests are about.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def perturbed_copy(model, noise: float, seed: int):
    """A draft that mostly agrees with the target: the same weights plus Gaussian noise."""
    import copy

    torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(noise * parameter.std() * torch.randn_like(parameter))
    return draft


def save_pair(root: Path, noise: float = 0.3, seed: int = 0) -> tuple[Path, Path]:
    """Target and draft folders sharing one tokenizer; the draft is a noisy copy of the target."""
    tokenizer_dir = root / "tokenizer"
    tokenizer = save_tokenizer(tokenizer_dir)
    target = make_llama(len(tokenizer), seed)
    draft = perturbed_copy(target, noise, seed + 1)
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = root / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]


def make_bigram_llama(tokenizer_size: int, table: dict[int, dict[int, float]], floor: float = -40.0):
    """A real LlamaForCausalLM whose next-token logits depend on the last token only, as `table` says
    ({previous: {next: logit}}; every other next token gets `floor`, every other previous token the
    row of the table's first key). The blocks add nothing (their output projections are zero), the
    embedding is one-hot and the final norm undoes its scale, so the head reads the previous token:
    the exact distribution of any continuation is a product of table rows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    size = tokenizer_size
    hidden = -(-size // 8) * 8  # 4 heads of an even size, at least one dimension per token
    config = LlamaConfig(
        vocab_size=size, hidden_size=hidden, intermediate_size=8, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False, rms_norm_eps=1e-12,
        eos_token_id=2, bos_token_id=1, pad_token_id=0,
    )
    model = LlamaForCausalLM(config)
    default = table[next(iter(table))]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(size, hidden))
        model.model.norm.weight.fill_(hidden ** -0.5)  # RMSNorm of a one-hot row is sqrt(H) times it
        head = torch.full((size, hidden), floor)
        for previous in range(size):
            for following, logit in table.get(previous, default).items():
                head[following, previous] = logit
        model.lm_head.weight.copy_(head)
    return model.eval()


def save_bigram_pair(root: Path, target_table: dict, draft_table: dict) -> tuple[Path, Path]:
    """Target and draft folders (bigram Llamas, make_bigram_llama) sharing the tiny tokenizer."""
    tokenizer = save_tokenizer(root / "tokenizer")
    paths = []
    for name, table in (("target", target_table), ("draft", draft_table)):
        path = root / name
        make_bigram_llama(len(tokenizer), table).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]


class LengthCache:
    """What a bigram model's cache needs to hold: how many positions it has seen (a next-token row
    depends on the last token only, which the engine always passes)."""

    def __init__(self):
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        self.length += tokens_to_remove  # transformers 5's sign: a negative count removes


def fast_bigram_pair(pair):
    """The loaded bigram pair (save_bigram_pair, through load_hub_pair) with each model's decoder
    replaced by what it computes: the final hidden state of a token is its one-hot row (embedding
    one-hot, blocks adding zero, the norm undoing its scale). Everything after the decoder (the head,
    path logits, the cache's length and crops) is the real adapter's. About a third of the cost of
    the real forward, for the tests that need thousands of runs; tests/test_exactness.py checks that
    both give the same hidden states."""
    from dataclasses import replace

    from dropmatch.decoding.causal_lm import CausalLM

    class FastBigram(CausalLM):
        def __init__(self, real: CausalLM):
            super().__init__(real.model, real.name, real.vocab_size)
            self.rows = torch.eye(real.model.config.vocab_size, real.hidden_size)

        def new_cache(self):
            return LengthCache()

        @torch.inference_mode()
        def hidden(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
            rows = self.rows[input_ids]
            if self.layers_kept:  # every block adds zero: each layer's input is the token's one-hot row
                self.kept_inputs = (cache.length, rows.repeat(1, len(self.layers_kept)))
            cache.length += int(input_ids.numel())
            return rows

    return replace(pair, target=FastBigram(pair.target), draft=FastBigram(pair.draft))


# ---------------------------------------------------------------- EAGLE-3 heads, saved in their published formats


def eagle3_tensors(target, draft_ids: list[int], layer_ids, fmt: str, seed: int = 0, scale: float = 0.3, sharpness=8.0,
                   heads: int = 4, kv_heads: int = 2, own_embedding: bool = False, qk_norm: bool = False,
                   hidden: int | None = None) -> dict:
    """A random head's tensors by the keys its format uses: the authors' ("eagle": `midlayer.*`) or
    speculators' (`layers.0.*`); d2t maps draft id i to target id draft_ids[i] (t2d marks them). hidden: the
    head's own width (default: the target's)."""
    target_hidden, vocab = target.config.hidden_size, target.config.vocab_size
    hidden = hidden or target_hidden
    head_dim, prefix = hidden // heads, "midlayer." if fmt == "eagle" else "layers.0."
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator) * scale

    def norm():
        return 1.0 + 0.1 * torch.randn(hidden, generator=generator)

    tensors = {"fc.weight": rand(hidden, len(layer_ids) * target_hidden), "norm.weight": norm(),
               "lm_head.weight": sharpness * rand(len(draft_ids), hidden),
               "d2t": torch.tensor(draft_ids) - torch.arange(len(draft_ids)),
               "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill(0, torch.tensor(draft_ids), True)}
    layer = {"hidden_norm.weight": norm(), "input_layernorm.weight": norm(), "post_attention_layernorm.weight": norm(),
             "self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
             "self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
             "self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
             "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
             "mlp.gate_proj.weight": rand(2 * hidden, hidden), "mlp.up_proj.weight": rand(2 * hidden, hidden),
             "mlp.down_proj.weight": rand(hidden, 2 * hidden)}
    if qk_norm:
        layer.update({"self_attn.q_norm.weight": 1.0 + 0.1 * torch.randn(head_dim, generator=generator),
                      "self_attn.k_norm.weight": 1.0 + 0.1 * torch.randn(head_dim, generator=generator)})
    tensors.update({prefix + key: value for key, value in layer.items()})
    if own_embedding:
        tensors["embed_tokens.weight"] = rand(vocab, hidden)
    return tensors


def save_eagle3_head(folder: Path, target, draft_ids: list[int], layer_ids, fmt: str = "eagle", seed: int = 0,
                     safetensors: bool = False, own_embedding: bool = False, default_layers: bool = False,
                     config_changes: dict | None = None, hidden: int | None = None, sharpness: float = 8.0) -> Path:
    """A tiny random EAGLE-3 head for `target` saved as its format publishes one: "eagle" (SafeAILab's config.json
    and pytorch_model.bin, or model.safetensors; AngelSlim's heads are the same) or "speculators" (a qwen3 layer,
    model.safetensors). default_layers: no layer ids in the config (the authors' default then applies); hidden: the
    head's own width (with its own embedding), narrower than the target's; sharpness: its head's scale (8: nearly
    one-hot drafts, as the tiny targets' own)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    target_hidden, vocab = target.config.hidden_size, target.config.vocab_size
    hidden = hidden or target_hidden
    layer = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": 4, "num_key_value_heads": 2,
             "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "vocab_size": vocab, "max_position_embeddings": 1024}
    ids = {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}
    if fmt == "eagle":
        config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **layer,
                  "draft_vocab_size": len(draft_ids), "target_hidden_size": target_hidden,
                  **({} if default_layers else {"eagle_config": ids})}
    else:
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "transformer_layer_config": {"model_type": "qwen3", "head_dim": hidden // 4, **layer},
                  "draft_vocab_size": len(draft_ids), "norm_before_residual": False, "target_hidden_size": target_hidden,
                  "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                         "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}},
                  **({} if default_layers else ids)}
    config.update(config_changes or {})
    (folder / "config.json").write_text(json.dumps(config))
    tensors = eagle3_tensors(target, draft_ids, layer_ids, fmt, seed, own_embedding=own_embedding or hidden is not None,
                             qk_norm=fmt == "speculators", hidden=hidden, sharpness=sharpness)
    if safetensors or fmt == "speculators":
        from safetensors.torch import save_file

        save_file({key: value.contiguous() for key, value in tensors.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(tensors, folder / "pytorch_model.bin")
    return folder
