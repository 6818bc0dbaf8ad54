"""DropMatch through transformers' own door: `target.generate(..., assistant_model=draft, custom_generate=...)`.

    out = target.generate(**inputs, assistant_model=draft, custom_generate="path/or/owner/dropmatch",
                          trust_remote_code=True, max_new_tokens=64, dropmatch_rule="dropmatch")

`custom_generate/generate.py` (the layout transformers loads from a repository) calls `generate` here.
The user's two models become the engine's pair as they are (no copy, no reload); every rule of the rule
table and its knobs arrive as `dropmatch_<name>` keywords (RuleConfig.from_mapping's names, the vLLM
plugin's) and go through the same settings code, so a bad value is the same one-line ValueError. What
the engine cannot honour (beams, a batch, logits processors, a draft on another tokenizer or device,
sampling filters other than temperature and top-p) is refused in one line naming the argument, never
silently ignored. docs/generate.md has the argument table.

No surprises in the caller's process: the models are used as given and left as they were (training flag,
requires_grad, attributes: nothing is stored on them); torch's global generator is read only under sampling
without a dropmatch_seed, as transformers' own sampling reads it; a greedy call is a function of its
inputs and dropmatch_seed. The run keeps no records beyond each drafted slot's reason.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
import weakref
from collections import Counter

import torch

from . import eagle3
from .acceptance import METHOD, RULES
from .config import ConfigError, DecodeConfig, PairSpec, RuleConfig, rule_keys
from .engine import Engine
from .causal_lm import CausalLM, LoadedPair, as_ids
from .recorder import reason_summary

PREFIX = "dropmatch_"
# Not the rule's: how many tokens a round drafts ("auto": from this machine's measured costs), the
# seed that keys the dropout masks (with the prompt and each position) and the run's sampling stream, and an
# EAGLE-3 head over the model (its folder) to draft with instead of assistant_model.
OWN_KEYS = ("gamma", "seed", "eagle3_head")
# dropmatch_seed's default under greedy: the masks, hence the output, are then a function of the inputs.
# Under sampling the default is one draw from torch's global generator (torch.manual_seed makes a call
# repeatable, as it does transformers' own sampling).
GREEDY_SEED = 0


# GenerationConfig values that change which tokens come out, with the value that changes nothing.
NEUTRAL = {"num_beams": 1, "num_beam_groups": 1, "num_return_sequences": 1, "penalty_alpha": None,
           "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
           "bad_words_ids": None, "force_words_ids": None, "min_length": 0, "min_new_tokens": None,
           "min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "suppress_tokens": None,
           "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
           "sequence_bias": None, "guidance_scale": None, "watermarking_config": None, "output_scores": False,
           "output_logits": False, "output_attentions": False, "output_hidden_states": False,
           "prompt_lookup_num_tokens": None}
PASSED_THROUGH = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "negative_prompt_ids",
                  "negative_prompt_attention_mask", "assistant_tokenizer", "synced_gpus", "use_model_defaults")


@dataclasses.dataclass
class Request:
    """One generate() call, checked: the prompt ids [n], the settings, the stop tokens and strings."""

    prompt_ids: list[int]
    decode: DecodeConfig
    rule: RuleConfig
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    return_dict: bool
    head: str = ""  # dropmatch_eagle3_head: drafts from this EAGLE-3 head (decode.draft_source "eagle3")


def default_rule() -> RuleConfig:
    """generate()'s rule when the call names none: the method's operating point (DropMatch at its knobs'
    defaults), with every knob of the rule table as it is now (a rule registered after import brings its knobs)."""
    return RuleConfig(METHOD)


def generate(model, inputs=None, generation_config=None, assistant_model=None, streamer=None, **kwargs):
    """transformers' generate() with DropMatch's verification: the target `model`, the draft
    `assistant_model`. Returns the sequences [1, prompt + new] (LongTensor on the model's device) or,
    with return_dict_in_generate=True, a DropMatchGenerateOutput whose `dropmatch` holds the counts per
    reason. ValueError (one line) for what it cannot do."""
    try:
        request = parse_request(model, inputs, generation_config, assistant_model, kwargs)
        engine = engine_for(model, assistant_model, request.stop_ids, kwargs.get("tokenizer"), request.head)
        reasons, new_tokens = _run(engine, request, streamer, kwargs.get("tokenizer"))
        _keep_costs(engine, model, model if assistant_model is None else assistant_model)
    except ConfigError as error:  # a setting, or a run the pair cannot make (a judge rule without a judge)
        raise ValueError(str(error)) from None
    sequences = torch.tensor([request.prompt_ids + new_tokens], dtype=torch.long, device=engine.device)
    if not request.return_dict:
        return sequences
    return _output_class()(sequences=sequences, dropmatch=reason_summary(dict(reasons)))


def parse_request(model, inputs, generation_config, assistant_model, kwargs: dict) -> Request:
    """The call's arguments checked and turned into the engine's settings; ConfigError (one line)."""
    kwargs = dict(kwargs)
    tokenizer = kwargs.get("tokenizer")
    knobs = {key[len(PREFIX):]: kwargs.pop(key) for key in list(kwargs) if key.startswith(PREFIX)}
    own = {key: knobs.pop(key) for key in OWN_KEYS if key in knobs}
    unknown = sorted(set(knobs) - set(rule_keys()))
    if unknown:
        raise ConfigError(f"unknown argument {PREFIX}{unknown[0]}; DropMatch's are "
                          f"{', '.join(PREFIX + k for k in (*rule_keys(), *OWN_KEYS))}")
    rule = RuleConfig.from_mapping(knobs, default_rule())
    prompt_ids = _prompt_ids(inputs, kwargs)
    head = str(own.get("eagle3_head") or "")
    _check_pair(model, assistant_model if not head or assistant_model is not None else model, tokenizer, prompt_ids)
    config = _generation_config(model, generation_config, kwargs)
    greedy = not config.do_sample
    if not greedy and config.top_k not in (None, 0):
        raise ConfigError(f"top_k={config.top_k}: DropMatch samples with temperature and top-p only; pass top_k=0 "
                          "(or None), and top_p to filter")
    max_new = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - len(prompt_ids)
    if max_new < 1:
        raise ConfigError(f"max_length={config.max_length} leaves no room after the prompt's {len(prompt_ids)} tokens; "
                          "pass max_new_tokens")
    decode = DecodeConfig(**DecodeConfig.parse_gamma(own.get("gamma", "auto")), max_new_tokens=max_new,
                          temperature=0.0 if greedy else (config.temperature if config.temperature is not None else 1.0),
                          top_p=config.top_p if config.top_p is not None else 1.0,
                          seed=_seed(own, greedy),
                          draft_source=eagle3.SOURCE if head else "model")
    _check_draft_length(rule, decode)
    stop_strings = config.stop_strings or ()
    stop_strings = (stop_strings,) if isinstance(stop_strings, str) else tuple(stop_strings)
    if stop_strings and tokenizer is None:
        raise ConfigError("stop_strings needs the tokenizer: pass tokenizer=... as transformers' generate() asks")
    return Request(prompt_ids, decode, rule, frozenset(as_ids(config.eos_token_id)), stop_strings,
                   bool(config.return_dict_in_generate), head)


def _check_draft_length(rule: RuleConfig, decode: DecodeConfig) -> None:
    """ConfigError when the rule's window needs more drafts a round than the call drafts (gamma = auto: at most
    its cap), so that it could never act (acceptance.Rule.min_drafts)."""
    min_drafts = RULES[rule.rule].min_drafts
    needed = min_drafts(rule) if min_drafts is not None else 0
    if needed > decode.gamma:
        asked = f"'auto' (at most {decode.gamma} drafts a round)" if decode.gamma_auto else str(decode.gamma)
        raise ConfigError(f"{PREFIX}rule={rule.rule!r} can never act at {PREFIX}gamma={asked}: its window needs at "
                          f"least {needed} drafts a round; pass {PREFIX}gamma={needed} or more")


def _seed(own: dict, greedy: bool) -> int:
    """dropmatch_seed as given; else GREEDY_SEED under greedy (torch's global generator untouched), one
    draw from torch's global generator under sampling."""
    if "seed" in own:
        return own["seed"]
    return GREEDY_SEED if greedy else int(torch.randint(0, 2**62, (1,)))


def _prompt_ids(inputs, kwargs: dict) -> list[int]:
    """The one prompt of the batch as ids; ConfigError for a batch, padding, or embeddings."""
    input_ids = inputs if inputs is not None else kwargs.get("input_ids")
    if kwargs.get("inputs_embeds") is not None:
        raise ConfigError("inputs_embeds is not supported: pass input_ids")
    if input_ids is None or not isinstance(input_ids, torch.Tensor):
        raise ConfigError("input_ids: pass the prompt's token ids (a LongTensor [1, n])")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ConfigError(f"input_ids of shape {tuple(input_ids.shape)}: DropMatch decodes one prompt at a time "
                          "(batch size 1, at least one token)")
    mask = kwargs.get("attention_mask")
    if mask is not None and not bool(torch.as_tensor(mask).bool().all()):
        raise ConfigError("attention_mask has padding: DropMatch decodes one unpadded prompt at a time")
    return [int(i) for i in input_ids[0].tolist()]


def _generation_config(model, generation_config, kwargs: dict):
    """The call's GenerationConfig (the given one or the model's, the call's keywords over it), checked:
    ConfigError naming the first argument the engine cannot honour."""
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    for name in PASSED_THROUGH:
        value = kwargs.pop(name, None)
        if name in ("logits_processor", "stopping_criteria", "synced_gpus", "use_model_defaults") and not value:
            continue
        if value is not None:
            raise ConfigError(f"{name} is not supported by DropMatch's generate (it would be ignored)")
    for name in ("input_ids", "attention_mask", "tokenizer"):
        kwargs.pop(name, None)
    unused = config.update(**kwargs)
    if unused:
        raise ConfigError(f"unknown argument {sorted(unused)[0]}: not a generation setting DropMatch can honour")
    for name, neutral in NEUTRAL.items():
        value = getattr(config, name, neutral)
        if value is not None and value != neutral and not (neutral is None and value in (0, 1.0, False, [])):
            what = "beams" if name == "num_beams" else name
            raise ConfigError(f"{name}={value!r}: {what} not supported by DropMatch's generate")
    return config


def _check_pair(model, assistant_model, tokenizer, prompt_ids: list[int]) -> None:
    """ConfigError unless the draft is given, on the target's device, and of the target's vocabulary: both
    models read and score every token of the tokenizer (given one; else every token either head scores, as
    transformers' assisted generation asks one vocabulary size) and of the prompt."""
    if assistant_model is None:
        raise ConfigError("assistant_model: DropMatch verifies a draft model's tokens; pass assistant_model=draft "
                          "(or dropmatch_eagle3_head=an EAGLE-3 head's folder)")
    target_device = next(model.parameters()).device
    draft_device = next(assistant_model.parameters()).device
    if target_device != draft_device:
        raise ConfigError(f"assistant_model is on {draft_device}, the model on {target_device}: put the pair on one device")
    heads = [_head_size(m) for m in (model, assistant_model)]
    known = min(*heads, *(int(m.get_input_embeddings().weight.shape[0]) for m in (model, assistant_model)))
    needed = len(tokenizer) if tokenizer is not None else max(heads)
    if known < needed:
        sizes = f"the tokenizer has {needed}" if tokenizer is not None else f"the heads score {heads[0]} and {heads[1]}"
        hint = "" if tokenizer is not None else " (pass tokenizer=... where both pad it to different sizes)"
        raise ConfigError(f"the model and assistant_model read and score {known} tokens in common but {sizes}: the "
                          f"draft must share the target's tokenizer{hint}")
    if max(prompt_ids) >= known:
        raise ConfigError(f"input_ids hold token {max(prompt_ids)}, beyond the {known} tokens both models know")


def _head_size(model) -> int:
    """How many tokens a model's head scores (a restricted draft head scores the full vocabulary)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "vocab_size", None) or head.weight.shape[0])


# gamma = auto's measured step costs per (target, draft) pair, kept between calls beside the models and
# weakly (never on them): an entry goes with either model. Keyed by what the costs depend on.
_MEASURED_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def engine_for(model, assistant_model, stop_ids: frozenset[int], tokenizer=None, head: str = "") -> Engine:
    """An engine over the user's two models as they are, for this call only (an engine kept between
    calls would keep the models alive); gamma = auto's costs measured on an earlier call are reused.
    head: an EAGLE-3 head's folder (read once per model, kept beside it weakly); without
    assistant_model the head alone drafts (the pair's draft slot then holds the target, never run as one)."""
    assistant_model = model if assistant_model is None else assistant_model
    vocab_size = min(_head_size(m) for m in (model, assistant_model))
    names = [getattr(m, "name_or_path", "") or type(m).__name__ for m in (model, assistant_model)]
    target = CausalLM(model, names[0], vocab_size)
    pair = LoadedPair(target=target, draft=CausalLM(assistant_model, names[1], vocab_size),
                      tokenizer=tokenizer, spec=PairSpec(*names, head=head), source="transformers generate()",
                      head=_head(model, target, head) if head else None)
    engine = Engine(pair, stop_ids=stop_ids, prepare_paths=False)  # the head's path copies only if the rule reads paths
    kept = _MEASURED_COSTS.get(model, {}).get(assistant_model)
    if kept is not None and kept[0] == _cost_key(engine):
        engine.services.adopt_costs(kept[1])
    return engine


_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {head name: (module, layer ids)}


def _head(model, target: CausalLM, name: str) -> eagle3.Eagle3Head:
    """The EAGLE-3 head in folder `name` bound to this call's adapter of `model`; read and checked once per model
    (ConfigError, one line, where it does not fit). A folder only: the staged package imports nothing beyond
    torch and transformers (a hub head: huggingface_hub.snapshot_download first)."""
    kept = _HEADS.setdefault(model, {})
    if name not in kept:
        loaded = eagle3.load_named(name, target, _no_folder)
        kept[name] = (loaded.module, loaded.layer_ids)
    module, layer_ids = kept[name]
    return eagle3.Eagle3Head(module, target, layer_ids, name)


def _no_folder(name: str):
    raise ConfigError(f"dropmatch_eagle3_head={name!r} is no folder: download a hub head first "
                      "(huggingface_hub.snapshot_download) and pass its folder")


def _cost_key(engine: Engine) -> tuple:
    """What measured step costs depend on besides the two models: the device and both dtypes."""
    return engine.device, engine.target.compute_dtype, engine.draft.compute_dtype


def _keep_costs(engine: Engine, model, assistant_model) -> None:
    """Remember the costs the call measured (gamma = auto) for the next call on this pair."""
    costs = engine.services.measured_costs
    if costs is not None:
        _MEASURED_COSTS.setdefault(model, weakref.WeakKeyDictionary())[assistant_model] = (_cost_key(engine), costs)


def _run(engine: Engine, request: Request, streamer, tokenizer) -> tuple[Counter, list[int]]:
    """The run, its new tokens streamed round by round (the prompt first, as transformers does), cut
    where a stop string completes. Returns (the count of each drafted slot's reason, new token ids)."""
    stop = threading.Event()
    run = engine.speculative_tokens(request.prompt_ids, request.decode, request.rule, stop_event=stop)
    if streamer is not None:
        streamer.put(torch.tensor([request.prompt_ids]))
    new_tokens: list[int] = []
    reasons: Counter = Counter()
    while True:
        try:
            step = next(run)
        except StopIteration as done:
            output_ids = done.value
            break
        reasons.update(step.reasons)
        fresh = ([step.context_token] if not new_tokens else []) + list(step.emitted)
        fresh, ended = _until_stop_string(new_tokens, fresh, request.stop_strings, tokenizer)
        _stream(streamer, fresh)
        new_tokens += fresh
        if ended:
            stop.set()
    if not new_tokens:  # the run ended at its first token (an EOS, or max_new_tokens 1)
        new_tokens = [output_ids[0]]
        _stream(streamer, new_tokens)
    if streamer is not None:
        streamer.end()
    return reasons, new_tokens


def _stream(streamer, tokens: list[int]) -> None:
    if streamer is not None and tokens:
        streamer.put(torch.tensor(tokens))


def _until_stop_string(done: list[int], fresh: list[int], stop_strings: tuple[str, ...], tokenizer):
    """fresh cut after the token whose text completes a stop string (as transformers' StopStringCriteria
    ends there); (fresh, whether a stop string completed)."""
    if not stop_strings:
        return fresh, False
    for end in range(1, len(fresh) + 1):
        text = tokenizer.decode(done + fresh[:end])
        if any(stop in text for stop in stop_strings):  # none was in `done`: the run would have ended there
            return fresh[:end], True
    return fresh, False


@functools.lru_cache(maxsize=1)
def _output_class():
    """DropMatchGenerateOutput, a transformers GenerateDecoderOnlyOutput with a `dropmatch` field (made on first
    use: transformers is imported only when generate() runs)."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    @dataclasses.dataclass
    class DropMatchGenerateOutput(GenerateDecoderOnlyOutput):
        """transformers' decoder-only output plus `dropmatch`: the run's counts per reason
        ({"drafted", "accepted_exactly", "accepted_lossy", "reasons": {reason: count}})."""

        dropmatch: dict | None = None

    return DropMatchGenerateOutput
