"""The app's components, top to bottom, one builder per part; no event is wired here (listeners.py).
Every control starts at the one table of defaults (config.DEFAULTS)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import gradio as gr

from .. import plots
from ..decoding.acceptance import KNOBS, MAX_GAMMA, RULES, Knob
from ..assets import (ROBUSTNESS_LONG_DRAFT_FILE, how_it_works, load_examples, load_robustness, load_same_drafts,
                      page_file, tab_note)
from ..decoding.config import DEFAULTS, LAB_P, METHOD_SETTINGS, PRESETS
from ..runfile import recorded_runs
from ..render import legend_html
from ..rule_words import KNOB_HELP
from . import views

# The Run button's inputs: Settings fields that have a control, then every rule knob's (Ui.setting_names).
SETTING_CONTROLS = ("prompt", "pair", "target_id", "draft_id", "head_id", "gamma", "rule", "temperature", "top_p",
                    "max_new_tokens", "seed", "run_autoregressive", "draft_source", "gamma_tuned_for_rule")
LAB_PREFIX = "lab_"  # a rule-lab control's name in a view: lab_<knob name>
SESSION_TTL_S = 3600
# The tabs by what a visitor came for: (group, its id, its tabs' labels). The groups' row sits right under the
# status line, so it is on the first screen of a projector and of a phone; tab rows wrap instead of hiding tabs.
TAB_GROUPS = (("Watch", "watch", ("Replay", "Step through", "Charts")),
              ("Compare", "compare", ("Rule lab", "Trade-offs", "Robustness")),
              ("Learn", "learn", ("Lessons", "Toy head", "How it works")),
              ("Files", "files", ("Downloads", "Recorded runs")))
# Where a newcomer first meets these words (under the colour legend): one line each.
TERMS_HTML = ('<div class="dm-terms"><span><b>tau</b>: tokens per target call (round), the correction or bonus '
              'included; higher is fewer expensive calls.</span><span><b>JS</b>: Jensen-Shannon divergence, how far '
              'apart two next-token distributions are (0 = the same, at most ln 2 ≈ 0.69).</span><span><b>centroid'
              '</b>: the mean of the K dropout paths\' distributions, the point the draft is measured against.</span>'
              '</div>')


@dataclass
class Ui:
    """Every component the callbacks read or write, by name."""

    prompt: gr.Textbox
    prompt_note: gr.Markdown
    pair: gr.Dropdown
    target_id: gr.Textbox
    draft_id: gr.Textbox
    head_id: gr.Textbox
    gamma: gr.Dropdown
    draft_source: gr.Radio
    rule: gr.Dropdown
    rule_knobs: dict  # knob key -> its control in Settings (acceptance.KNOBS; the chosen rule's are shown)
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Slider
    seed: gr.Number
    run_autoregressive: gr.Checkbox
    gamma_tuned_for_rule: gr.Checkbox
    method_button: gr.Button
    run_button: gr.Button
    stop_button: gr.Button
    status: gr.Markdown
    verdict: gr.Markdown
    fix_button: gr.Button
    fix_settings: gr.State
    lossy_header: gr.Markdown
    lossless_out: gr.HTML
    lossy_out: gr.HTML
    lossless_stats: gr.HTML
    lossy_stats: gr.HTML
    plot_agreement: gr.Plot
    plot_js: gr.Plot
    plot_acceptance: gr.Plot
    plot_calls: gr.Plot
    plot_tradeoff: gr.Plot
    plot_robustness: gr.Plot
    step_column: gr.Radio
    step_round: gr.Slider
    step_out: gr.HTML
    replay_out: gr.HTML
    lesson_out: gr.HTML
    tabs: gr.Tabs
    watch_tabs: gr.Tabs
    compare_tabs: gr.Tabs
    learn_tabs: gr.Tabs
    files_tabs: gr.Tabs
    download_trace: gr.File
    download_metrics: gr.File
    recorded_choice: gr.Dropdown
    recorded_upload: gr.File
    lab_knobs: dict  # knob name -> its rule-lab control (the knobs the table offers the lab)
    lab_status: gr.Markdown
    lab_out: gr.HTML
    lab_summary: gr.HTML
    lab_disagreements: gr.Checkbox
    lab_matrix: gr.State
    last_run: gr.State
    load_timer: gr.Timer

    def setting_names(self) -> tuple[str, ...]:
        return (*SETTING_CONTROLS, *self.rule_knobs)

    def setting_components(self) -> list:
        return [self.component(name) for name in self.setting_names()]

    def lab_controls(self) -> list:
        return list(self.lab_knobs.values())

    def component(self, name: str):
        """A component by its name in a view: a field, a knob's key, or lab_<knob name>."""
        if name.startswith(LAB_PREFIX) and name[len(LAB_PREFIX):] in self.lab_knobs:
            return self.lab_knobs[name[len(LAB_PREFIX):]]
        return self.rule_knobs[name] if name in self.rule_knobs else getattr(self, name)

    def view_components(self) -> list:
        """Every component a finished or recorded run writes."""
        names = ("status", "verdict", "lossy_header", "lossless_out", "lossy_out", "lossless_stats", "lossy_stats",
                 "plot_agreement", "plot_js", "plot_acceptance", "plot_calls", "plot_tradeoff", "step_round",
                 "step_out", "replay_out", "lesson_out", "last_run", "download_trace", "download_metrics", "load_timer",
                 "lab_status", "lab_out", "lab_summary", "lab_matrix", "lab_disagreements", "fix_button", "fix_settings")
        return [getattr(self, name) for name in names] + self.lab_controls()

    def bind(self, view: dict) -> dict:
        """A view by name (Ui.component) -> a Gradio update by component."""
        return {self.component(name): value for name, value in view.items()}


def build_layout() -> Ui:
    """The components, top to bottom; no event is wired here."""
    parts: dict = {}
    gr.Markdown("# DropMatch Studio\nLossless speculative decoding and **DropMatch** side by side, on the same "
                "prompt, seed and model pair — and, token by token, why each draft token was accepted.")
    _prompt_and_pair(parts)
    # The status sits right under Run, above Settings: open settings must not push it off the first screen.
    parts["status"] = gr.Markdown(views.FIRST_STATUS, elem_id="status")
    parts["load_timer"] = gr.Timer(1.0)
    # Charts follow the theme and the width.
    gr.HTML("", js_on_load=page_file("theme.js"), elem_id="theme-js", padding=False)
    with gr.Tabs(elem_id="tabs", overflow_behavior="wrap") as parts["tabs"]:
        for group, group_id, names in TAB_GROUPS:
            with gr.Tab(group, id=group_id, elem_id=f"{group_id}-group"):
                if group_id == "watch":
                    _run_view(parts)
                with gr.Tabs(elem_id=f"{group_id}-tabs", overflow_behavior="wrap") as parts[f"{group_id}_tabs"]:
                    for name in names:
                        build, tab_id, elem_id, noted = TAB_BUILDERS[name]
                        with gr.Tab(name, id=tab_id, elem_id=elem_id):
                            if noted:
                                gr.Markdown(tab_note(name))
                            build(parts)
    # A visitor's run and matrix go an hour after their last use (a long-lived server keeps no stale sessions).
    parts["last_run"] = gr.State(None, time_to_live=SESSION_TTL_S)
    parts["lab_matrix"] = gr.State(None, time_to_live=SESSION_TTL_S)
    assert {f.name for f in fields(Ui)} == set(parts), "every Ui field is built exactly once"
    return Ui(**parts)


def _run_view(parts: dict) -> None:
    """The Watch group above its tabs: examples, settings, the verdict, both columns (on a 1400x900 first screen
    with their first tokens), then the legend with its terms (each column has its own colour key)."""
    _examples(parts)
    _settings(parts)
    _columns(parts)
    gr.HTML(f'<div id="dm-after-tokens" tabindex="-1"></div>{legend_html()}{TERMS_HTML}', elem_id="legend")


def _prompt_and_pair(parts: dict) -> None:
    with gr.Row():
        with gr.Column(scale=3):
            parts["prompt"] = gr.Textbox(label="Prompt", lines=4, placeholder="Ask something, or pick an example below",
                                          elem_id="prompt")
            parts["prompt_note"] = gr.Markdown("", elem_id="prompt-note")
        with gr.Column(scale=2):
            parts["pair"] = gr.Dropdown(list(PRESETS), value=DEFAULTS.pair, label="Model pair", elem_id="pair-choice")
            parts["target_id"] = gr.Textbox(DEFAULTS.target_id, label="Target hub id", visible=False, placeholder="e.g. Qwen/Qwen3-8B")
            parts["draft_id"] = gr.Textbox(DEFAULTS.draft_id, label="Draft hub id", visible=False, placeholder="e.g. Qwen/Qwen3-0.6B")
            parts["head_id"] = gr.Textbox(DEFAULTS.head_id, label="EAGLE-3 head hub id (optional)", visible=False,
                                          placeholder="e.g. AngelSlim/Qwen3-8B_eagle3")
            with gr.Row():
                parts["run_button"] = gr.Button("Run", variant="primary", elem_id="run-button", min_width=100)
                # Inactive until a run goes on (listeners.py switches it on and off).
                parts["stop_button"] = gr.Button("Stop", variant="secondary", interactive=False, elem_id="stop-button",
                                                 min_width=100)
            parts["method_button"] = gr.Button(method_button_label(False), size="sm", elem_id="method-button")


def method_button_label(in_use: bool) -> str:
    """The paper's-settings button: what a click does, or that they are the ones in use."""
    k, p = METHOD_SETTINGS["k"], METHOD_SETTINGS["p"]
    return f"✓ Using the paper's settings: K {k}, p {p}" if in_use else f"Use the paper's settings: K {k}, p {p}"


def _examples(parts: dict) -> None:
    """Under the prompt, Run and the status, not between them: on a phone Run stays on the first screen."""
    examples = [[example["prompt"]] for example in load_examples()]
    if examples:
        gr.Examples(examples=examples, inputs=[parts["prompt"]], label="Examples (GSM8K, HumanEval, MT-Bench, IFEval)")


def _settings(parts: dict) -> None:
    # Outside the closed accordion: its listener is installed at page load, not when Settings first opens.
    gr.HTML("", js_on_load=page_file("clamp.js"), elem_id="clamp-notes", padding=False)
    with gr.Accordion("Settings", open=False, elem_id="settings"):  # closed: the columns fit a projector's first screen
        with gr.Row():
            parts["gamma"] = gr.Dropdown(["auto", *map(str, range(1, MAX_GAMMA + 1))], value=DEFAULTS.gamma, label="draft length γ",
                                         info="auto: each round drafts the length with the most expected tokens "
                                              "per second (costs measured here)")
            parts["draft_source"] = gr.Radio(views.draft_source_choices(DEFAULTS.pair), value=DEFAULTS.draft_source,
                                             label="drafts from", info="model: the draft model; ngram: prompt lookup "
                                             "(free); hybrid: lookup where the text repeats, the model elsewhere; "
                                             "eagle3: a pair's EAGLE-3 head")
            parts["rule"] = gr.Dropdown(views.lossy_rule_choices(), value=DEFAULTS.rule, label="rule (right column)",
                                        elem_id="rule-choice", min_width=320)
        with gr.Row():
            parts["temperature"] = gr.Slider(0.0, 2.0, value=DEFAULTS.temperature, step=0.05,
                                             label="temperature (0 = greedy)")
            parts["top_p"] = gr.Slider(0.05, 1.0, value=DEFAULTS.top_p, step=0.05, label="top-p")
            parts["max_new_tokens"] = gr.Slider(1, 512, value=DEFAULTS.max_new_tokens, step=1, label="max new tokens")
            parts["seed"] = gr.Number(value=DEFAULTS.seed, precision=0, label="seed")
            parts["run_autoregressive"] = gr.Checkbox(value=DEFAULTS.run_autoregressive,
                                                      label="measure autoregressive baseline")
            parts["gamma_tuned_for_rule"] = gr.Checkbox(
                value=DEFAULTS.gamma_tuned_for_rule, label="draft length tuned for this rule's cost",
                info="off: both columns choose γ = auto by lossless SD's costs, so tau differs only by the rule; "
                     "on: the lossy column also prices its verify step (faster, but fewer drafts to accept)")
        gr.Markdown("The chosen rule's knobs (every rule's are in the rule table, acceptance.py):")
        with gr.Row(elem_id="rule-knobs"):
            parts["rule_knobs"] = {knob.user_key: knob_control(knob, DEFAULTS.rule, f"knob-{knob.user_key}")
                                   for knob in KNOBS.values()}


def knob_control(knob: Knob, rule: str, elem_id: str, lab: bool = False):
    """A knob's control, built from its declaration: text where it takes "auto", a checkbox, a choice, a
    slider where it declares one, else a number; shown where `rule` reads it (lab: always)."""
    value = DEFAULTS.knobs.get(knob.user_key, knob.app_default) if not lab else knob.default
    common = dict(label=knob.label + (" (or auto)" if knob.auto and not lab else ""), info=None if lab else KNOB_HELP[knob.name],
                  elem_id=elem_id, visible=lab or knob_shown(knob.name, rule))
    if lab:  # wide enough for its label, number box and slider ends: the lab's row wraps instead of clipping them
        common["min_width"] = 250
    if knob.auto and not lab:
        return gr.Textbox(value=str(value), **common)
    if knob.kind is bool:
        return gr.Checkbox(value=bool(value), **common)
    if knob.choices:
        return gr.Radio(list(knob.choices), value=value, **common)
    if knob.slider:
        low, high, step = knob.slider
        return gr.Slider(low, high, value=LAB_P if lab and knob.auto else value, step=step, **common)
    return gr.Number(value=value, precision=0 if knob.kind is int else None, **common)


def knob_shown(name: str, rule: str) -> bool:
    """Whether the Settings control of a knob shows for this rule: the knobs it reads."""
    return rule in RULES and any(knob.name == name for knob in RULES[rule].knobs)


def _columns(parts: dict) -> None:
    parts["verdict"] = gr.Markdown("", elem_id="verdict")
    # A rule that could not act at these settings: the fix it names, one click away (views.fix_view).
    parts["fix_button"] = gr.Button("", visible=False, size="sm", elem_id="fix-button")
    parts["fix_settings"] = gr.State({})
    # A keyboard user's way past the columns' hundreds of focusable tokens (to the tabs: Replay's Play, ...).
    gr.HTML('<a class="dm-skip" href="#dm-after-tokens">Skip past the tokens</a>', elem_id="skip-tokens", padding=False)
    with gr.Row(equal_height=False):
        with gr.Column(elem_id="lossless-column"):
            gr.Markdown("### Lossless SD")
            parts["lossless_out"] = gr.HTML(elem_id="lossless-text", js_on_load=page_file("popover.js"))
            parts["lossless_stats"] = gr.HTML(elem_id="lossless-stats")
        with gr.Column(elem_id="lossy-column"):
            parts["lossy_header"] = gr.Markdown(views.lossy_title(DEFAULTS.rule))
            parts["lossy_out"] = gr.HTML(elem_id="lossy-text", js_on_load=page_file("popover.js"))
            parts["lossy_stats"] = gr.HTML(elem_id="lossy-stats")


def _replay_tab(parts: dict) -> None:
    parts["replay_out"] = gr.HTML(views.replay_html(None), js_on_load=page_file("replay.js"), elem_id="replay")


def _lessons_tab(parts: dict) -> None:
    parts["lesson_out"] = gr.HTML(views.lessons_html(None), js_on_load=page_file("lessons.js"), elem_id="lessons")


def _charts_tab(parts: dict) -> None:
    with gr.Row():
        parts["plot_agreement"] = gr.Plot(show_label=False, label="MC-path agreement", elem_id="plot-agreement")
        parts["plot_js"] = gr.Plot(show_label=False, label="JS vs threshold", elem_id="plot-js")
    with gr.Row():
        parts["plot_acceptance"] = gr.Plot(show_label=False, label="Acceptance length", elem_id="plot-acceptance")
        parts["plot_calls"] = gr.Plot(show_label=False, label="Tokens vs target calls", elem_id="plot-calls")


def _step_tab(parts: dict) -> None:
    with gr.Row():
        parts["step_column"] = gr.Radio(["lossy rule", "lossless"], value="lossy rule", label="column")
        parts["step_round"] = gr.Slider(0, 1, value=0, step=1, label="verification round", interactive=False)
    parts["step_out"] = gr.HTML("Run a comparison first.", elem_id="step-view")


def _lab_tab(parts: dict) -> None:
    with gr.Row(elem_id="lab-knobs"):  # the knobs the rule table offers the lab (Knob.lab), each from its declaration
        parts["lab_knobs"] = {knob.name: knob_control(knob, "", f"lab-{knob.user_key.replace('_', '-')}", lab=True)
                              for knob in KNOBS.values() if knob.lab}
    with gr.Row():
        parts["lab_status"] = gr.Markdown("Run a comparison (or open a recorded run) first.", elem_id="lab-status")
        parts["lab_disagreements"] = gr.Checkbox(False, label="only tokens where the rules disagree",
                                                 elem_id="lab-disagreements")
    parts["lab_summary"] = gr.HTML(elem_id="lab-summary")
    parts["lab_out"] = gr.HTML(elem_id="lab-matrix")


def _tradeoff_tab(parts: dict) -> None:
    parts["plot_tradeoff"] = gr.Plot(show_label=False, label="Trade-off frontier", elem_id="plot-tradeoff")


def _robustness_tab(parts: dict) -> None:
    document = load_robustness()
    gr.Markdown(views.same_drafts_markdown(load_same_drafts()), elem_id="same-drafts-table")
    gr.Markdown(tab_note("Robustness: each rule's own text"))
    parts["plot_robustness"] = gr.Plot(plots.robustness_figure(document), label="Robustness", show_label=False,
                                       elem_id="plot-robustness")
    gr.Markdown(views.robustness_markdown(document), elem_id="robustness-table")
    gr.Markdown(tab_note("Robustness: a long fixed draft"))
    gr.Markdown(views.robustness_markdown(load_robustness(ROBUSTNESS_LONG_DRAFT_FILE)), elem_id="robustness-long-table")


def _toy_tab(parts: dict) -> None:
    gr.HTML('<div class="dm-toy-host"></div>', js_on_load=page_file("toy_head.js"), elem_id="toy-head")


def _how_tab(parts: dict) -> None:
    gr.Markdown(how_it_works(), latex_delimiters=[{"left": "$", "right": "$", "display": False}])


def _downloads_tab(parts: dict) -> None:
    parts["download_trace"] = gr.File(label="trace (JSON)")
    parts["download_metrics"] = gr.File(label="metrics (CSV)")


def _recorded_tab(parts: dict) -> None:
    with gr.Row():
        parts["recorded_choice"] = gr.Dropdown(list(recorded_runs()), value=None, label="shipped runs",
                                               elem_id="recorded-choice")
        parts["recorded_upload"] = gr.File(label="open a recorded run (trace JSON)", file_types=[".json"],
                                           elem_id="recorded-upload")


# Each tab by its label (TAB_GROUPS names them): its builder, its gr.Tab's id and elem_id (None: it has none), and
# whether it opens with its note (assets/tab_notes.md).
TAB_BUILDERS = {
    "Replay": (_replay_tab, "replay", "replay-tab", True), "Step through": (_step_tab, None, "step-tab", False),
    "Charts": (_charts_tab, None, None, False), "Rule lab": (_lab_tab, None, "lab-tab", True),
    "Trade-offs": (_tradeoff_tab, None, "tradeoff-tab", True), "Toy head": (_toy_tab, None, "toy-tab", True),
    "Robustness": (_robustness_tab, None, "robustness-tab", True), "Downloads": (_downloads_tab, None, None, False),
    "Lessons": (_lessons_tab, "lessons", "lessons-tab", True), "How it works": (_how_tab, None, None, False),
    "Recorded runs": (_recorded_tab, None, "recorded-tab", True)}
