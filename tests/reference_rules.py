"""The acceptance rules' definitions as a test oracle, apart from the product: every drafted token decided in
plain Python and torch from DESIGN.md §1 and the authors' code (5SSjw/MARS evaluate_posterior, AMD-AGI/FLy and
vLLM's FLy, transformers' static ensemble), then the scan and the extra token. It imports no decision code
of the package, only data types (tests/test_house.py checks its imports): the product decides through
verifying.verify, and tests compare the two for every rule, greedy and sampled (tests/test_serving.py).

Two ways in: `decide_round` from what models and draws gave (logits, the draft's distributions, the paths'
logits, the judge's scores, the coins), every signal computed here; `decide` / `scan_reasons` from a
Signals record of hand-made or computed numbers (the rule unit tests), the decisions computed here."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dropmatch.decoding.acceptance import Signals, Verdict  # data types only

PATH_RULES = {"naive", "js", "majority", "dropmatch", "dropmatch_judge"}  # they read the K dropout paths
JUDGE_RULES = {"judge", "dropmatch_judge"}  # they read the trained judge
LOOKUP_EXACT = {"ensemble"}  # transformers refuses assistant_ensemble_weight with prompt lookup
FLY_GATE_OFF = 0.01  # AMD-AGI/FLy: entropy_thre <= 1e-2 is no gate


@dataclass
class Round:
    """One round as models and draws gave it. draft_tokens [g]; q_signal [g, V] the draft's smooth
    distribution (softmax(z / T), T = 1 when greedy); clean_logits [g + 1, V] the target's; q_sample [g, V]
    and p_sample [g + 1, V] what tokens are drawn from (sampling: temperature, then top-p; None when greedy);
    path_logits [K, g, V] the dropout paths' logits (path rules); judge_scores [g]; coin [g] the lossless
    test's draws (None: drawn here from the generator, as the engine draws them)."""

    draft_tokens: torch.Tensor
    q_signal: torch.Tensor
    clean_logits: torch.Tensor
    temperature: float = 0.0
    q_sample: torch.Tensor | None = None
    p_sample: torch.Tensor | None = None
    path_logits: torch.Tensor | None = None
    judge_scores: torch.Tensor | None = None
    coin: torch.Tensor | None = None
    draft_source: str = "model"


# ---------------------------------------------------------------- the signals, by definition


def _softmax64(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return (logits.double() / (temperature if temperature > 0 else 1.0)).softmax(-1)


def _js(a: torch.Tensor, b: torch.Tensor) -> float:
    """JS(a || b), natural log, in float64: 1/2 KL(a || m) + 1/2 KL(b || m)."""
    a, b = a.double(), b.double()
    m = (a + b) / 2
    kl = lambda x: float(torch.where(x > 0, x * (x / m).log(), torch.zeros_like(x)).sum())  # noqa: E731
    return max(0.5 * kl(a) + 0.5 * kl(b), 0.0)


def _entropy(p: torch.Tensor) -> float:
    p = p.double()
    return float(-(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum())


def _facts_of_round(rnd: Round) -> list[dict]:
    """Every number a rule reads at each drafted position, computed here from the round's raw inputs."""
    greedy = rnd.temperature == 0.0
    facts = []
    for i, token in enumerate(rnd.draft_tokens.tolist()):
        z = rnd.clean_logits[i].float()
        p = _softmax64(z, rnd.temperature)
        q = rnd.q_signal[i]
        top = int(z.argmax())
        runner = int(z.scatter(0, torch.tensor([top]), float("-inf")).argmax())
        z_top, z_runner = (z[top], z[runner]) if greedy else (z[top] / rnd.temperature, z[runner] / rnd.temperature)
        ratio = float(z_runner / (z_top + 1e-10))  # MARS's r after its temperature warper
        processed = p if greedy else rnd.p_sample[i].double()
        if not greedy and float(processed[runner]) == 0.0:
            runner = -1  # top-p removed it: MARS's top two after its processors are the top token alone
        top3 = processed.topk(min(3, processed.shape[-1])).values
        fact = dict(token=token, top=top, runner=runner, ratio=ratio, p_x=float(p[token]), entropy=_entropy(p),
                    top3=float(-(top3 * top3.clamp_min(1e-300).log()).sum()), js_q_p=_js(q, p))
        if rnd.path_logits is not None:
            fact.update(_path_facts(rnd.path_logits[:, i], q, rnd.temperature))
        if rnd.judge_scores is not None:
            fact["judge"] = float(rnd.judge_scores[i])
        facts.append(fact)
    return facts


def _path_facts(path_logits: torch.Tensor, q: torch.Tensor, temperature: float) -> dict:
    """path_logits [K, V] at one position -> each path's top token, JS(q || centroid), the threshold."""
    probs = _softmax64(path_logits, temperature)
    return {"path_tokens": [int(row.argmax()) for row in path_logits], "path_probs": probs, "q": q,
            "path_logits": path_logits}


def _centroid_facts(fact: dict, centroid: str, temperature: float) -> None:
    """JS(q || centroid) and max_k JS(p_k || centroid): the centroid the mean of the path distributions, or
    (a labelled option) the softmax of the mean logits."""
    if "path_probs" not in fact or "js_q_c" in fact:
        return
    probs = fact["path_probs"]
    mean = probs.mean(0) if centroid == "probs" else _softmax64(fact["path_logits"].double().mean(0), temperature)
    fact["js_q_c"] = _js(fact["q"], mean)
    fact["js_thr"] = max(_js(row, mean) for row in probs)


def _facts_of_signals(s: Signals) -> list[dict]:
    """The numbers of a Signals record (hand-made or computed elsewhere), position by position."""
    g = int(s.draft_tokens.shape[0])
    pick = lambda value, i: None if value is None else value[i].item()  # noqa: E731
    return [dict(token=int(s.draft_tokens[i]), top=int(s.target_tokens[i]), runner=pick(s.target_runner_up, i),
                 ratio=pick(s.target_logit_ratio, i), p_x=float(s.target_prob[i]), entropy=float(s.target_entropy[i]),
                 top3=pick(s.target_top3_entropy, i), js_q_p=float(s.js_draft_target[i]),
                 js_q_c=pick(s.js_draft_centroid, i), js_thr=pick(s.js_threshold, i),
                 path_tokens=None if s.path_tokens is None else s.path_tokens[:, i].tolist(),
                 judge=pick(s.judge_scores, i), v_top=pick(s.rule_top, i)) for i in range(g)]


# ---------------------------------------------------------------- the rules, by definition


def _needed(num_paths: int, fraction: float) -> int:
    return max(math.ceil(fraction * num_paths - 1e-9), num_paths // 2 + 1)


def _majority(fact: dict, fraction: float) -> bool:
    """The draft has ceil(f K) path votes (at least a strict majority) and no other token has as many."""
    votes = {}
    for token in fact["path_tokens"]:
        votes[token] = votes.get(token, 0) + 1
    mine = votes.get(fact["token"], 0)
    return mine >= _needed(len(fact["path_tokens"]), fraction) and all(
        n < mine for t, n in votes.items() if t != fact["token"])


def _fly_window(exact: list[bool], i: int, window: int) -> bool:
    """AMD's win_len: the next window - 1 drafts exact, and the window ends before the round's last draft."""
    return i < len(exact) - window and all(exact[i + 1: i + window])


def _checks(cfg, greedy: bool, fact: dict, i: int, exact: list[bool]) -> list[tuple[str, bool]]:
    """The rule's ordered checks at position i, the exact test aside."""
    if "given" in fact:  # a rule registered by a test, its checks given by the caller (decide's checks)
        return fact["given"]
    rule = cfg.rule
    judged = bool(cfg.rescue_argmax) or fact["token"] != fact["top"]
    js = ("js", judged and fact.get("js_q_c") is not None and fact["js_q_c"] <= fact["js_thr"])
    majority = ("majority", judged and fact.get("path_tokens") is not None and _majority(fact, cfg.majority_fraction))
    judge = ("judge", judged and fact.get("judge") is not None and fact["judge"] < cfg.judge_threshold)
    by_rule = {
        "lossless": [],
        "naive": [("naive", judged and fact["token"] in fact["path_tokens"])] if rule == "naive" else [],
        "js": [js], "majority": [majority], "dropmatch": [js, majority], "judge": [judge],
        "dropmatch_judge": [js, majority, judge],
        "typical": [("typical", fact["p_x"] > min(cfg.typical_eps, cfg.typical_delta * math.exp(-fact["entropy"])))],
        "fixed_js": [("fixed_js", fact["js_q_p"] <= cfg.fixed_js_threshold)],
    }
    if rule in by_rule:
        return by_rule[rule]
    if rule == "fly":
        unsure = cfg.fly_entropy_threshold <= FLY_GATE_OFF or fact["top3"] >= cfg.fly_entropy_threshold
        stands = not exact[i] and unsure and _fly_window(exact, i, cfg.fly_window)
        if not greedy:
            stands = stands and fact["sp_x"] > 0 and fact["sq_x"] > 0
        return [("fly", stands)]
    if rule == "ensemble":
        if greedy:
            return [("ensemble", fact["token"] == fact["v_top"])]
        w = cfg.ensemble_weight
        return [("ensemble", fact["coin"] * fact["sq_x"] < (1 - w) * fact["sq_x"] + w * fact["sp_x"])]
    if rule == "mars":
        return [("mars", fact["ratio"] > cfg.mars_threshold and fact["token"] in (fact["top"], fact["runner"]))]
    raise ValueError(f"the oracle has no definition of rule {rule!r}: write one")


def _replaces(cfg, greedy: bool, fact: dict) -> bool:
    """Where the rule's own test replaces the lossless one: the greedy ensemble everywhere; sampled MARS where
    its top two are close (their code accepts the top two without a coin and rejects any other draft)."""
    if cfg.rule == "ensemble":
        return greedy
    return cfg.rule == "mars" and not greedy and fact["ratio"] > cfg.mars_threshold


# ---------------------------------------------------------------- the round


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs.reshape(1, -1), 1, generator=generator)[0, 0])


def _lossless(facts: list[dict], greedy: bool, clean_logits, q_sample, p_sample, coin, generator) -> list[bool]:
    """The lossless test: greedy, the draft is the target's argmax; sampling, u q(x) < p(x) (u < p / q)."""
    g = len(facts)
    if greedy:
        return [fact["token"] == int(clean_logits[i].float().argmax()) for i, fact in enumerate(facts)]
    if coin is None:
        coin = torch.rand((g,), generator=generator, device=p_sample.device)
    exact = []
    for i, fact in enumerate(facts):
        p_x, q_x = p_sample[i, fact["token"]], q_sample[i, fact["token"]]
        fact.update(coin=float(coin[i]), sp_x=float(p_x), sq_x=float(q_x))
        exact.append(bool(coin[i] * q_x < p_x))
    return exact


def _verdict(cfg, greedy: bool, facts: list[dict], exact: list[bool], judged: bool, argmax: list[int],
             q_sample, p_sample, generator) -> Verdict:
    """The scan (exact, else the rule's first accepting check, else rejected and the rest unchecked), then
    the extra token: the correction at a rejection (greedy: argmax; sampling: norm(max(0, p - q)); where the
    rule's own test rejected: greedy the top of its own rows, sampling a draw from p), or the bonus."""
    reasons, own_rejection = [], False
    for i, fact in enumerate(facts):
        checks = _checks(cfg, greedy, fact, i, exact) if judged else []
        replaced = judged and _replaces(cfg, greedy, fact)
        accepted_by_rule = any(ok for _, ok in checks)
        if exact[i] and (accepted_by_rule or not replaced):
            reasons.append("exact")
            continue
        reason = next((name for name, ok in checks if ok), "rejected")
        reasons.append(reason)
        if reason == "rejected":
            own_rejection = replaced
            break
    accepted = len(reasons) - (reasons[-1] == "rejected" if reasons else 0)
    reasons += ["unchecked"] * (len(facts) - len(reasons))
    g = len(facts)
    if accepted == g:
        bonus = argmax[g] if greedy else _draw(p_sample[g], generator)
        return Verdict(accepted, tuple(reasons), bonus, "bonus")
    if greedy:
        token = facts[accepted]["v_top"] if own_rejection and cfg.rule == "ensemble" else argmax[accepted]
        return Verdict(accepted, tuple(reasons), token, "correction")
    p = p_sample[accepted]
    residual = p if own_rejection else (p - q_sample[accepted]).clamp_min(0.0)
    if float(residual.sum()) <= 0.0:
        residual = p
    return Verdict(accepted, tuple(reasons), _draw(residual / residual.sum(), generator), "correction")


def decide_round(cfg, rnd: Round, generator: torch.Generator | None = None) -> Verdict:
    """A round's verdict by the definitions, from its raw inputs (Round): every signal computed here."""
    greedy = rnd.temperature == 0.0
    facts = _facts_of_round(rnd)
    for fact in facts:
        _centroid_facts(fact, cfg.centroid, rnd.temperature)
    if cfg.rule == "ensemble" and greedy:
        w = cfg.ensemble_weight
        v = w * _softmax32(rnd.clean_logits[: len(facts)], 1.0) + (1.0 - w) * rnd.q_signal
        for fact, row in zip(facts, v):
            fact["v_top"] = int(row.argmax())
    exact = _lossless(facts, greedy, rnd.clean_logits, rnd.q_sample, rnd.p_sample, rnd.coin, generator)
    argmax = [int(row.float().argmax()) for row in rnd.clean_logits]
    judged = not (rnd.draft_source == "ngram" and cfg.rule in LOOKUP_EXACT)
    return _verdict(cfg, greedy, facts, exact, judged, argmax, rnd.q_sample, rnd.p_sample, generator)


def _softmax32(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return (logits.float() / temperature).softmax(-1)


def decide(cfg, greedy: bool, signals: Signals, q_sample: torch.Tensor, p_sample: torch.Tensor,
           generator: torch.Generator, exact: torch.Tensor | None = None, checks=None) -> Verdict:
    """A round's verdict from a Signals record: q_sample [g, V], p_sample [g + 1, V] the distributions tokens
    are drawn from; exact [g] the lossless test where the caller ran it (else run here, its coins drawn from
    the generator). checks: (signals, cfg) -> [(reason, mask [g])], for a rule a test registers (the
    oracle defines the table's own rules only)."""
    facts = _facts_of_signals(signals)
    if checks is not None:
        given = [(name, mask.tolist()) for name, mask in checks(signals, cfg)]
        for i, fact in enumerate(facts):
            fact["given"] = [(name, bool(mask[i])) for name, mask in given]
    g = len(facts)
    if exact is None:
        exact = _lossless(facts, greedy, p_sample, q_sample, p_sample, None, generator)
    else:
        exact = [bool(x) for x in exact.tolist()]
        _carry_coins(facts, signals)
    argmax = [int(row.argmax()) for row in p_sample[: g + 1]]
    return _verdict(cfg, greedy, facts, exact, True, argmax, q_sample, p_sample, generator)


def _carry_coins(facts: list[dict], s: Signals) -> None:
    if s.coin is None:
        return
    for i, fact in enumerate(facts):
        fact.update(coin=float(s.coin[i]), sp_x=float(s.sample_target_prob[i]), sq_x=float(s.sample_draft_prob[i]))


def scan_reasons(cfg, signals: Signals, exact: torch.Tensor, greedy: bool = True) -> tuple[str, ...]:
    """The reason of each drafted position [g] from a Signals record and the exact test [g]."""
    facts = _facts_of_signals(signals)
    _carry_coins(facts, signals)
    exact_list = [bool(x) for x in exact.tolist()]
    greedy = greedy and signals.coin is None
    reasons = []
    for i, fact in enumerate(facts):
        replaced = _replaces(cfg, greedy, fact) if fact.get("ratio") is not None or cfg.rule == "ensemble" else False
        checks = _checks(cfg, greedy, fact, i, exact_list)
        if exact_list[i] and (any(ok for _, ok in checks) or not replaced):
            reasons.append("exact")
            continue
        reasons.append(next((name for name, ok in checks if ok), "rejected"))
        if reasons[-1] == "rejected":
            break
    return tuple(reasons) + ("unchecked",) * (len(facts) - len(reasons))
