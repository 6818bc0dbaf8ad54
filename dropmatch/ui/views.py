"""What the app shows, as functions of data: a run's record (or a running Comparison) -> the
values of the app's components, by Ui field name. No model runs here."""

from __future__ import annotations

import html
import json
from pathlib import Path

import gradio as gr

from ..decoding.acceptance import BASELINE, KNOBS, METHOD, RULES
from ..assets import load_frontier
from .. import plots
from ..metrics import speed_ratio_interval, summarize
from ..runfile import Downloads, RunRecord
from ..decoding.config import DEFAULTS, DRAFT_SOURCES, HEAD_DRAFT_SOURCES, PRESETS, DecodeConfig, RuleConfig
from ..decoding.eagle3 import SOURCE as EAGLE3
from ..render import (cannot_act, draft_length_fix, explainer, lab_html, lab_summary_html, stats_html, step_html,
                      text_html, token_spans, verdict)
from ..builtin_lessons import lessons_html
from ..replay import replay_html
from ..rule_words import RULE_WORDS, column_title, drafted_by
from ..decoding.trace import GenerationTrace

FIGURE_NAMES = ("agreement", "js", "acceptance", "tokens_vs_calls")


def lossy_rule_choices() -> list[tuple[str, str]]:
    """(label, name) of every lossy rule of the one table, for the right column's dropdown."""
    return [(rule.label, name) for name, rule in RULES.items() if rule.lossy]


def lossy_title(rule: str) -> str:
    return f"### {column_title(rule)}" if rule in RULES else f"### {plots.run_label(rule)}"


def column_html(column, engine, decode: DecodeConfig, rule: RuleConfig) -> str:
    """A column of a running comparison (compare.Column), with a cursor until it is done; each token's
    popover ends with the rule's sentence for it (decode, rule: the column's settings)."""
    why = explainer(engine.services.token_text, decode, rule)
    ids = [] if column.first_token is None else [column.first_token, *(t for r in column.rounds for t in r.emitted)]
    spans = token_spans(column.first_token, column.rounds, engine.services.token_text, engine.stop_ids, why,
                        rejected=True, texts=engine.services.stream_texts(ids))
    return text_html(spans, cursor=not column.done)


def trace_html(trace: GenerationTrace, record: RunRecord) -> str:
    stop_ids = frozenset(trace.output_ids[-1:]) if trace.stop_reason == "eos" else frozenset()
    why = explainer(record.token_text, trace.decode_config, trace.rule_config)
    return text_html(token_spans(trace.first_token, list(trace.rounds), record.token_text, stop_ids, why, rejected=True,
                                 texts=trace.token_texts))


POLICY_NAMES = {"studio": "the Studio's (auto)", "long": "fixed 15", EAGLE3: "EAGLE-3 drafts"}
SCROLL_BOX = '<div class="dm-scroll dm-nowrap-table">\n\n{}\n\n</div>'  # tables scroll in it: no word breaks on a phone


def _table(head, rows) -> str:
    """A Markdown table: the header, its rule, then each row (a sequence of cells)."""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(row) + " |" for row in rows)])


def _measured_with(commands) -> str:
    """The commands a table came from, each a wrapping block ("" where none is kept)."""
    shown = "".join(f'<pre class="dm-command">{html.escape(c)}</pre>' for c in commands if c)
    return f"\n\nMeasured with:\n\n{shown}" if shown else ""


def same_drafts_markdown(document: dict | None) -> str:
    """The comparison on lossless SD's drafts (bench --same-drafts): a short table first (per draft policy and
    set, DropMatch's gain over lossless SD and each rival's against DropMatch, with 95% intervals, and the
    target's probability of what each accepted beyond the exact test), then every rule's rows, folded."""
    from ..bench.tables import SAME_DRAFTS_HEADER, gain_text, same_drafts_caption, same_drafts_rows

    if not document or not document.get("same_drafts"):
        return "No comparison on the same drafts is shipped with this build."
    shown = [METHOD, *(rule for rule in RULES if RULE_WORDS[rule].rival)]  # the short table: DropMatch and the field
    head = ["draft policy", "prompt set", *(f"{column_title(r)} vs {'lossless' if r == METHOD else 'DropMatch'}"
                                             for r in shown), "target p of the added tokens"]
    rows = []
    sets = document.get("same_drafts_info", {}).get("sets", {})
    for policy, by_set in document["same_drafts"].items():
        for name, rules in by_set.items():
            gains = [gain_text(rules.get(r, {}).get("gain" if r == METHOD else "against_method")) for r in shown]
            probs = " / ".join(f"{rules[r]['target_prob']['value']:.2f}" if rules.get(r, {}).get("target_prob") else "–"
                               for r in shown)
            rows.append([POLICY_NAMES.get(policy, policy), sets.get(name, {}).get("label", name), *gains, probs])
    full = [f"{same_drafts_caption(document, policy)}\n\n"
            + _table(SAME_DRAFTS_HEADER, [map(html.escape, row) for row in same_drafts_rows(document, policy)])
            for policy in document["same_drafts"]]
    settings = document.get("settings") or {}
    note = "\n\n*Interrupted: each set's label says how many of its prompts ran.*" if document.get("interrupted") else ""
    return (SCROLL_BOX.format(_table(head, rows)) + note
            + "\n\nThe probabilities are DropMatch's / MARS's / the ensemble's / the judge's / FLy's, in that order."
            + "\n\n<details><summary>Every rule, set and policy</summary>\n\n" + SCROLL_BOX.format("\n\n".join(full))
            + "</details>" + _measured_with(settings.get("commands") or [settings.get("command")]))


def _set_label(name: str, ran: int | None) -> str:
    """A prompt set as a reader counts it: "GSM8K test, 10 of 100" (of how many: the file's trailing count)."""
    from ..bench.prompts import set_title

    total = name.rsplit("_", 1)[-1]
    return f"{set_title(name)}, {ran} of {total}" if total.isdigit() and ran else \
        f"{set_title(name)}, {ran} prompt{'s' if ran != 1 else ''}" if ran else set_title(name)


def robustness_markdown(document: dict | None) -> str:
    """The robustness experiment's numbers under its chart: one row per benchmark and lossy run; tau gain and
    speed with their 95% intervals over prompts where the document keeps per-prompt counts (a lead or a
    trail is said only beyond the interval)."""
    from ..bench.tables import gain_text

    results = plots.robustness_rows(document)
    if not results:
        return "No robustness results are shipped with this build."
    head = ("benchmark", "run", "tau gain", "speed vs lossless", "ΔNLL", "Δoff-nucleus", "Δdistinct-2",
            "inside the band", "task score (lossless)")
    prompts = {name: b.get("prompts") for name, b in ((document or {}).get("benchmarks") or {}).items()}
    rows = []
    for r in results:
        band = "no: " + ", ".join(r["outside"]) if r["outside"] else "yes"
        score = "–" if r["score"] is None or r["lossless_score"] is None else "– (lossless SD scores 0 here)" \
            if r["lossless_score"] == 0 else f"{r['score']:.3f} ({r['lossless_score']:.3f})"
        tau_gain = gain_text(r["tau_gain_interval"]) if r["tau_gain_interval"] else f"{100 * r['tau_gain']:+.1f}%"
        ci = r["speed_interval"]
        speed = f"{ci['value']:.2f}x [{ci['low']:.2f}, {ci['high']:.2f}]" if ci else f"{r['speed'] or 0:.2f}x"
        rows.append([f"{_set_label(r['benchmark'], prompts.get(r['benchmark']))} ({r['place']})",
                     plots.run_label(r["run"]), tau_gain, speed, f"{r['delta_nll'] or 0:+.3f}",
                     f"{100 * (r['delta_off_nucleus'] or 0):+.1f} pt", f"{r['delta_distinct2'] or 0:+.3f}", band,
                     score])
    command = ((document or {}).get("settings") or {}).get("command")
    return SCROLL_BOX.format(_table(head, rows)) + _measured_with([command])


def tradeoff_figure(record: RunRecord | None, frontier: dict | None):
    """The shipped frontier (all prompts) with this run's point on it."""
    if frontier is None:
        return plots.frontier_figure([], None, None)
    points = [p for p in frontier["frontier"] if p["benchmark"] == "all"]
    current = None
    if record is not None:
        lossless, lossy = record.metrics()
        if lossless.tau and lossy.tau:
            current = {"tau_gain": lossy.tau / lossless.tau - 1, "target_nll": lossy.target_nll,
                       "off_nucleus_rate": lossy.off_nucleus_rate,
                       "label": f"this run ({plots.run_label(record.rule)})"}
    reference = (frontier.get("reference") or {}).get("target_sampled")
    return plots.frontier_figure(points, frontier["rules"].get(BASELINE), reference, current,
                                 title="Trade-off frontier of the embedded pair (shipped benchmark) and this run")


def finished_view(record: RunRecord, downloads: Downloads, recorded_from: str | None = None,
                  shipped: Path | None = None) -> dict:
    """Every output of a finished run (or of a recorded one, `recorded_from` naming it; `shipped`: the
    file it came with, offered as its download instead of a copy), by Ui field name."""
    lossless_metrics, lossy_metrics = record.metrics()
    figs = plots.all_figures(record.lossless, record.lossy, record.ar, record.token_text)
    trace_file, metrics_file = downloads.for_shipped(shipped, record) if shipped else downloads.write(record)
    rounds = len(record.lossy.rounds)
    return {
        "status": _finished_note(record, recorded_from),
        "verdict": verdict_markdown(record, lossless_metrics, lossy_metrics, recorded_from),
        **fix_view(record.lossy),
        "lossy_header": lossy_title(record.rule),
        "lossless_out": trace_html(record.lossless, record),
        "lossy_out": trace_html(record.lossy, record),
        "lossless_stats": stats_html(lossless_metrics),
        "lossy_stats": stats_html(lossy_metrics, p_auto=record.p_auto, p_auto_reached=record.lossy.p_auto_reached)
                       + peer_html(record.peer, lossy_metrics),
        "plot_agreement": figs["agreement"], "plot_js": figs["js"],
        "plot_acceptance": figs["acceptance"], "plot_calls": figs["tokens_vs_calls"],
        "plot_tradeoff": tradeoff_figure(record, load_frontier()),
        # A slider's maximum must exceed its minimum: a one-round run gets 0..1, fixed at 0.
        "step_round": gr.update(maximum=max(rounds - 1, 1), value=0, interactive=rounds > 1),
        "replay_out": replay_html(record, recorded_from or "this run"),
        "lesson_out": lessons_html(record, recorded_from or "this run"),
        "step_out": round_html(record, record.lossy, 0) if rounds else "No rounds ran.",
        "last_run": record,
        "download_trace": trace_file, "download_metrics": metrics_file,
        **lab_view(record),
    }


def peer_html(peer: dict | None, ours) -> str:
    """The peer row under the ensemble column: transformers' own static ensemble on the same pair and settings."""
    if not peer:
        return ""
    speed = peer["tokens"] / peer["seconds"] if peer["seconds"] else 0.0
    nll = "–" if peer["target_nll"] is None else f"{peer['target_nll']:.3f}"
    ours_nll = "–" if ours.target_nll is None else f"{ours.target_nll:.3f}"
    return (f'<p class="dm-peer">Peer: transformers\' own static ensemble (<code>assistant_ensemble_weight={peer["weight"]:g}'
            f'</code>, the same pair, temperature, top-p and draft length) wrote {peer["tokens"]} tokens at '
            f'{speed:.1f} tokens/s, target NLL {nll} (this column: {ours.tokens_per_s:.1f} tokens/s, NLL {ours_nll}); '
            "its draws are its own, so its text is another sample of the same rule.</p>")


def verdict_markdown(record: RunRecord, lossless_metrics, lossy_metrics, recorded_from: str | None) -> str:
    """The verdict line above the columns (render.verdict), marked as a recorded run's where it is one."""
    label = plots.run_label(record.rule)
    where = f"**Recorded run: {recorded_from}.** " if recorded_from else ""
    if record.lossy.decode_config.draft_source == EAGLE3:  # the paper's headline setting, named at once
        where += f"**On EAGLE-3 drafts** (both columns drafted by {drafted_by(EAGLE3)}). "
    spread = speed_ratio_interval(record.lossless, record.lossy)
    machine = f"recorded on {record.made}" if recorded_from and record.made else \
        "a recorded run's machine" if recorded_from else "this machine"
    ar = None if record.ar is None else summarize(record.ar, record.alone_tokens_per_s)
    return with_cannot_act(f"{where}{verdict(lossless_metrics, lossy_metrics, label, spread, machine, ar)}", record.lossy)


def with_cannot_act(text: str, trace) -> str:
    """The verdict with, after its headline, why the rule could not act at these settings (render.cannot_act)."""
    note = cannot_act(trace)
    if not note:
        return text
    headline, _, rest = text.partition("\n\n")
    return f"{headline}\n\n**{note}**" + (f"\n\n{rest}" if rest else "")


def settings_view(record: RunRecord) -> dict:
    """A run's prompt, rule and settings as the Settings controls hold them, by Settings name (an auto knob's box
    says "auto"; the pair stays as chosen): a loaded run put back in the controls, so that Run runs it again."""
    decode, rule = record.lossy.decode_config, record.lossy.rule_config
    knobs = {KNOBS[name].user_key: ("auto" if value is None else str(value)) if KNOBS[name].auto else value
             for name, value in rule.knobs.items() if name in KNOBS}
    return {"prompt": record.prompt, "rule": record.rule, "gamma": "auto" if decode.gamma_auto else str(decode.gamma),
            "temperature": decode.temperature, "top_p": decode.top_p, "max_new_tokens": decode.max_new_tokens,
            "seed": decode.seed, "draft_source": decode.draft_source, "run_autoregressive": record.ar is not None,
            "gamma_tuned_for_rule": decode.gamma_tuned_for_rule, **knobs}


def fix_view(trace) -> dict:
    """The fix button under the verdict: shown with the draft length it applies where too few of the run's rounds
    drafted what the rule needs to act (render.draft_length_fix)."""
    gamma = draft_length_fix(trace)
    if gamma is None:
        return {"fix_button": gr.update(visible=False), "fix_settings": {}}
    return {"fix_button": gr.update(visible=True, value=f"Use {column_title(trace.rule)}'s authors' draft length "
                                                       f"(γ {gamma})"),
            "fix_settings": {"gamma": str(gamma)}}


def early_stats(state, shown: set) -> dict:
    """Each column's numbers as soon as they exist, before the autoregressive baseline: lossless SD's
    when its run ends, the lossy column's and the verdict when both have (its comparisons read lossless
    SD's); the speedup rows fill when the baseline ends. `shown` keeps what was sent already."""
    update = {}
    if state.lossless.done and "lossless" not in shown:
        shown.add("lossless")
        update["lossless_stats"] = stats_html(summarize(state.lossless.trace))
    if state.lossless.done and state.lossy.done and "lossy" not in shown:
        shown.add("lossy")
        lossless, lossy = summarize(state.lossless.trace), summarize(state.lossy.trace, lossless=state.lossless.trace)
        update["lossy_stats"] = stats_html(lossy, p_auto=state.rule.p is None,
                                           p_auto_reached=state.lossy.trace.p_auto_reached)
        spread = speed_ratio_interval(state.lossless.trace, state.lossy.trace)
        update["verdict"] = with_cannot_act(verdict(lossless, lossy, RULES[state.rule.rule].label, spread),
                                            state.lossy.trace)
        update.update(fix_view(state.lossy.trace))
    return update


FIRST_STATUS = "Pick an example or type a prompt, then **Run**."  # the status line until the pair is loaded
RECORDED_NOTE = "Showing a **recorded run**"  # how the status line names a recorded run on screen
LOADING_NOTE = "Loading **"  # the load timer's line (pair_host.LoadStatus.line); a Run that waits says "Waiting for"
NO_LAB_STATES = "This run kept no states for the rule lab (record it again with this version)."


def _finished_note(record: RunRecord, recorded_from: str | None) -> str:
    """The status after a run, short enough to stay on a phone's first screen under Run."""
    if recorded_from is None:
        done = "Done." if record.ar is not None else "Done (autoregressive baseline off: no speedup shown)."
        return (f"{done} Same prompt, seed and pair for both columns. Hover, tap or focus a token for its numbers; "
                "open *Step through* to see one round in detail.")
    return (f"{RECORDED_NOTE}, *{recorded_from}* ({record.lossless.target_name}); no model ran. "
            "**Run** runs the prompt in the box live.")


def lab_view(record: RunRecord) -> dict:
    """The rule lab at the run's own settings (the matrix the run recorded), controls set to them."""
    if record.lab is None:
        return {"lab_out": "", "lab_summary": "", "lab_matrix": None, "lab_status": NO_LAB_STATES}
    settings = record.lab["settings"]
    return {"lab_out": lab_html(record.lab), "lab_summary": lab_summary_html(record.lab), "lab_matrix": record.lab,
            "lab_disagreements": False,
            "lab_status": f"The lossless column's {len(record.lab['rows'])} drafted tokens under every rule, at the "
                          "run's own settings. Move a control to re-judge them.",
            **{f"lab_{name}": settings[name] for name, knob in KNOBS.items() if knob.lab and name in settings}}


def matrix_view(matrix: dict, seconds: float, disagreements_only: bool) -> dict:
    """The rule lab after a re-judge at the controls' settings."""
    return {"lab_out": lab_html(matrix, disagreements_only), "lab_summary": lab_summary_html(matrix),
            "lab_matrix": matrix,
            "lab_status": f"Re-judged {len(matrix['rows'])} drafted tokens under {len(matrix['rules'])} rules in "
                          f"{seconds:.2f} s through the heads only (no transformer block ran)."}


def step_view(record: RunRecord | None, which: str, index) -> str:
    """One round of a column in detail."""
    if record is None:
        return "Run a comparison first."
    trace = record.lossy if which == "lossy rule" else record.lossless
    if not trace.rounds:
        return "No rounds ran."
    index = max(0, min(int(index or 0), len(trace.rounds) - 1))
    return round_html(record, trace, index)


def round_html(record: RunRecord, trace: GenerationTrace, index: int) -> str:
    """The step view of one round of a column, its sentences in the terms of the column's own rule."""
    return step_html(trace.rounds[index], record.token_text, trace.rule_config, trace.temperature == 0)


def api_result(record: RunRecord, rule) -> dict:
    """What /compare returns: both texts, both metric sets, the figures as JSON, the rule lab."""
    lossless_metrics, lossy_metrics = record.metrics()
    figs = plots.all_figures(record.lossless, record.lossy, record.ar, record.token_text)
    return {
        "prompt": record.prompt,
        "rule": rule.rule,
        "verdict": verdict(lossless_metrics, lossy_metrics, RULES[rule.rule].label,
                           speed_ratio_interval(record.lossless, record.lossy)),
        "lossless": {"text": record.lossless.text, "metrics": lossless_metrics.to_dict()},
        "lossy": {"text": record.lossy.text, "metrics": lossy_metrics.to_dict(), "p": record.lossy.p,
                  "p_auto_reached": record.lossy.p_auto_reached, "settings": rule.to_mapping()},
        "autoregressive": None if record.ar is None else {"text": record.ar.text},
        "target_alone": record.target_alone,  # transformers' generate() timed: every speedup_vs_ar's denominator
        "figures": {name: json.loads(figs[name].to_json()) for name in FIGURE_NAMES},
        "lab": record.lab,
    }


LONG_PROMPT_TOKENS = 1000  # from this many prompt tokens on, the page says the prompt's cost before the run
CHARS_PER_TOKEN = 4  # the rough count said while no tokenizer is loaded


def prompt_note(prompt: str, engine) -> str:
    """One line under a long prompt, before the run: its tokens (the loaded pair's tokenizer; a rough count by
    characters while none is loaded) and, once a run on this machine read a prompt, what reading this one costs."""
    if not isinstance(prompt, str) or len(prompt) < LONG_PROMPT_TOKENS:
        return ""
    tokens = len(prompt) // CHARS_PER_TOKEN if engine is None else len(engine.encode(prompt))
    if tokens < LONG_PROMPT_TOKENS:
        return ""
    if engine is None:
        return (f"⏱ A long prompt: about {tokens:,} tokens (counted by characters; the pair is still loading). Each "
                "run reads it first, and every later step attends over it: expect a slower run.")
    return (f"⏱ A long prompt: **{tokens:,} tokens**.{_reading_time(tokens, engine.services.prefill)} Each of the three "
            "runs (lossless SD, the rule, the autoregressive baseline) reads it, then attends over it at every step: "
            "expect a slower run.")


def _reading_time(tokens: int, prefill: tuple[int, float] | None) -> str:
    """The seconds reading `tokens` takes, at the rate a run on this machine read its longest prompt (prefill:
    (tokens, seconds)); "at least" beyond it, as attention makes every further token slower. "" before any run."""
    if not prefill or prefill[1] <= 0:
        return ""
    read, seconds = prefill
    estimate = seconds * tokens / read
    bound = "at least " if tokens > read else ""
    return (f" Reading it takes {bound}≈ {estimate:.{0 if estimate >= 10 else 1}f} s per run on this machine (at the "
            f"{read / seconds:,.0f} tokens/s a run here read a {read:,}-token prompt).")


def draft_source_choices(pair: str | None) -> list[str]:
    """The draft sources a pair offers: eagle3 where it has an EAGLE-3 head, or may have one (custom hub ids;
    None: every source, as a restored run's settings may ask one the pair lacks: Run then says so in one line)."""
    spec = PRESETS.get(pair) if pair is not None else None
    return list(DRAFT_SOURCES) + (list(HEAD_DRAFT_SOURCES) if spec is None or spec.head else [])


def pair_view(pair: str, draft_source: str) -> list:
    """A pair's choice -> the custom hub ids shown or hidden, and its draft sources (one it lacks goes back to the
    default)."""
    custom = gr.update(visible=PRESETS.get(pair, "custom") is None)
    choices = draft_source_choices(pair)
    source = draft_source if draft_source in choices else DEFAULTS.draft_source
    return [custom, custom, custom, gr.update(choices=choices, value=source)]


def load_status_view(status, shown: str) -> tuple:
    """(status line, timer) while the pair loads in the background (pair_host.LoadStatus): the seconds
    so far, then the outcome once, and the timer stops. shown: the status line on the page; a line that
    the visitor's own action wrote there (a refusal, "Running …", the paper's settings) is kept: a tick answered late must not hide it."""
    timer = gr.Timer(active=status.state == "loading")
    if not (shown or "").startswith((FIRST_STATUS, LOADING_NOTE, RECORDED_NOTE)) or status.state == "idle":
        return gr.update(), timer
    if status.state == "ready":
        return (status.line() + " **Run** runs the prompt in the box live (until then the columns show a recorded "
                "run); or pick an example or type your own."), timer
    return status.line(), timer


def shipped_run_title(shipped: dict, asked: str) -> str | None:
    """The title of the shipped run a link names (its file name, e.g. 2_chat_writing, or its title), or None."""
    wanted = asked.strip().lower().replace(" ", "_")
    for title, path in shipped.items():
        if wanted and wanted in (path.stem.lower(), title.lower().replace(" ", "_")):
            return title
    return None
