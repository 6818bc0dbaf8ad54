"""What a loaded pair offers beside decoding: its token texts, what computed a run (weights
fingerprints, device, dtype), its trained judge and gamma = auto's step costs on this machine. The
engine runs rounds; this serves it and everything that shows or re-judges its runs (the Studio's rule
lab reads a pair through it: lab.rule_lab).

    services = PairServices(pair)
    services.token_text(42)          # " the"
    services.stream_texts([42, 7])   # each token's text in its run, whole characters only
    services.step_costs()            # measured once, on first use
"""

from __future__ import annotations

import functools
import re

import torch

from . import drafting
from .config import AUTO_GAMMA_CAP, ConfigError, RuleConfig
from .causal_lm import CausalLM, LoadedPair
from .timing import best_seconds
from .trained_judge import TrainedJudge, judge_for


class PairServices:
    """One loaded pair's services: token text (cached), fingerprints, the trained judge, step costs."""

    def __init__(self, pair: LoadedPair, judge: TrainedJudge | None = None):
        """judge: the trained judge for the judge rules; by default the shipped one where it was
        trained on this target (the embedded pair), else none (those rules then refuse in one line)."""
        self.target: CausalLM = pair.target
        self.draft: CausalLM = pair.draft
        self.tokenizer = pair.tokenizer
        self.source_label = pair.source or pair.spec.label
        self._judge = judge  # None: the shipped one where it fits, looked up on first use
        self._judge_looked_up = judge is not None
        self._token_texts: dict[int, str] = {}
        self._joined_texts: dict[tuple[int, ...], str] = {}  # stream_texts' decodes of several tokens
        self._costs: drafting.StepCosts | None = None
        self.prefill: tuple[int, float] | None = None  # (tokens, seconds): the longest prompt a run read so far

    @property
    def judge(self) -> TrainedJudge | None:
        """The trained judge of the judge rules: the one given, else the shipped one where it was trained on this
        target (read on first use: a run of another rule never opens the file)."""
        if not self._judge_looked_up:
            self._judge = judge_for(self.target.name, self.target.hidden_size)
            self._judge_looked_up = True
        return self._judge

    @property
    def weights(self) -> str:
        """The weights fingerprint "target+draft" (CausalLM.fingerprint: computed on first use, once per adapter)."""
        return f"{self.target.fingerprint()}+{self.draft.fingerprint()}"

    @property
    def kernels(self) -> str:
        """The CPU kernels the loader chose (cpu_kernels.kernel_summary), "target ...; draft ...": recorded with
        every run beside the fingerprint; they change products by fp32 rounding only, so the rule lab does
        not refuse a run made with other kernels."""
        return f"target {self.target.kernels} | draft {self.draft.kernels}"

    @property
    def names(self) -> tuple[str, str]:
        """(target name, draft name): what a trace records as its pair."""
        return self.target.name, self.draft.name

    def computed_by(self) -> tuple[str, str, str]:
        """(weights fingerprint "target+draft", device type, the target's dtype): what a trace records
        so that the rule lab re-judges a run only with what made it."""
        return self.weights, self.target.device.type, str(self.target.compute_dtype).removeprefix("torch.")

    # ------------------------------------------------------------ token text

    def token_text(self, token: int) -> str:
        """The text of one token id, as the UI shows it (a pair without a tokenizer: "<id>"); a token that is
        part of a character (byte-level tokenizers split Arabic, CJK and emoji) shows its bytes, "<0xD8>"."""
        if not self.tokenizer:
            return f"<{token}>"
        text = self._token_texts.get(token)
        if text is None:
            text = self._joined_text((token,))
            if BROKEN in text:
                text = bytes_shown(self.tokenizer.convert_ids_to_tokens(token)) or text
            self._token_texts[token] = text
        return text

    def stream_texts(self, ids) -> tuple[str, ...]:
        """Each token's text as it reads in the run `ids` (stream_texts), decodes cached: what a trace keeps
        per output token."""
        return stream_texts(ids, self._joined_text)

    def _joined_text(self, ids: tuple[int, ...]) -> str:
        text = self._joined_texts.get(ids)
        if text is None:
            text = self._joined_texts[ids] = (self.tokenizer.decode(list(ids)) if self.tokenizer
                                              else "".join(map(self.token_text, ids)))
        return text

    # ------------------------------------------------------------ the trained judge

    def with_judge(self, rule: RuleConfig) -> RuleConfig:
        """The rule with the judge's validation-chosen threshold filled in where it reads the judge and
        sets none; ConfigError (one line) when it reads the judge and this pair has none."""
        if not rule.uses_judge:
            return rule
        if self.judge is None:
            raise ConfigError(f"the rule {rule.rule!r} needs a trained judge for this target; "
                              "only the embedded pair ships one (assets/judge)")
        return self.judge.filled(rule)

    # ------------------------------------------------------------ step costs (gamma = auto) and prefill

    def note_prefill(self, tokens: int, seconds: float) -> None:
        """A run read a prompt of `tokens` in `seconds`: the longest one read is what a long prompt's notice
        estimates its reading time from (a short prompt's rate says little about a long one's)."""
        if self.prefill is None or tokens >= self.prefill[0]:
            self.prefill = (tokens, seconds)

    @property
    def measured_costs(self) -> drafting.StepCosts | None:
        """step_costs if they were measured already, else None (never measures)."""
        return self._costs

    def adopt_costs(self, costs: drafting.StepCosts) -> None:
        """Costs measured earlier for this very pair on this device (generate() keeps them between calls)."""
        self._costs = costs

    def step_costs(self) -> drafting.StepCosts:
        """gamma = auto's cost model for this pair on this machine, measured on first use."""
        if self._costs is None:
            self._costs = measure_step_costs(self.target, self.draft)
        return self._costs


BROKEN = "\ufffd"  # what a tokenizer decodes a character's partial bytes to
BYTE_SHOWN = re.compile(r"<0x[0-9A-F]{2}>")  # a byte of a token that holds part of a character (bytes_shown)
MAX_CHARACTER_TOKENS = 4  # a UTF-8 character has at most 4 bytes, so at most 4 byte-level tokens


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted (a vocabulary entry's character -> the byte it stands for): printable
    bytes stand for themselves, the others for chr(256 + n) in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {**{chr(byte): byte for byte in printable}, **{chr(256 + n): byte for n, byte in enumerate(others)}}


def bytes_shown(piece: str) -> str | None:
    """A vocabulary entry (byte-level "Ø§", or SentencePiece's byte fallback "<0xD8>") as text, every byte that is
    not part of a whole character shown as "<0xD8>"; None for an entry of neither kind."""
    alphabet = _byte_level_alphabet()
    if re.fullmatch(r"(<0x[0-9A-Fa-f]{2}>)+", piece):
        raw = bytes.fromhex(piece.replace("<0x", "").replace(">", ""))
    elif piece and all(char in alphabet for char in piece):
        raw = bytes(alphabet[char] for char in piece)
    else:
        return None
    text = raw.decode("utf-8", errors="surrogateescape")  # a stray byte b becomes U+DC00 + b
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def stream_texts(ids, decode) -> tuple[str, ...]:
    """Each token's text as it reads in the run `ids`: a token that ends inside a character (byte-level
    tokenizers split Arabic, CJK and emoji into byte tokens) shows "", its bytes joining the next token's text,
    so no text holds a broken character and they join to the run's text. decode: a tuple of ids -> text."""
    texts, pending = [], ()
    for token in ids:
        pending += (token,)
        text = decode(pending)
        if text.endswith(BROKEN) and len(pending) < MAX_CHARACTER_TOKENS:
            texts.append("")  # not a whole character yet
            continue
        texts.append(text)
        pending = ()
    return tuple(texts)


@torch.inference_mode()
def measure_step_costs(target: CausalLM, draft: CausalLM, context: int = 32, repeats: int = 3) -> drafting.StepCosts:
    """The best of `repeats` timings, after a context of `context` tokens: one draft step (one token
    in, its logits), and a target call over 1 and AUTO_GAMMA_CAP + 1 positions (with the clean logits
    of every position, as a round computes them). Measured, never assumed: machines differ."""
    wide = AUTO_GAMMA_CAP + 1
    ids = torch.tensor([(7 * i + 11) % target.vocab_size for i in range(context + wide)], device=target.device)

    def best(model: CausalLM, positions: int) -> float:
        cache = model.new_cache()
        model.hidden(ids[:context], cache)
        return best_seconds(model.device, repeats,
                            lambda: model.logits(model.hidden(ids[context : context + positions], cache)),
                            lambda: model.crop(cache, context))

    one, many = best(target, 1), best(target, wide)
    return drafting.StepCosts(draft_step=best(draft, 1), verify_base=one,
                              verify_per_position=max(many - one, 0.0) / (wide - 1))
