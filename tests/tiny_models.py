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
            cache.length += int(input_ids.numel())
            return self.rows[input_ids]

    return replace(pair, target=FastBigram(pair.target), draft=FastBigram(pair.draft))
