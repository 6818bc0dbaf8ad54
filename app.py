"""DropMatch Studio: lossless speculative decoding and DropMatch side by side.

    python app.py            # the embedded CPU pair, on http://127.0.0.1:7860
    python app.py --port 8080 --share

`create_demo(studio)` builds the Blocks from a Studio (dropmatch/studio.py), which loads models
on first use; nothing heavy happens at import time.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import tempfile
from pathlib import Path

import gradio as gr

from dropmatch.compare import Comparison, compare_stream
from dropmatch.config import CENTROIDS, ConfigError, DecodeConfig, RuleConfig, parse_p
from dropmatch.render import css, legend_html, stats_html, step_html, text_html, token_spans
from dropmatch.studio import DEFAULT_PRESET, PRESETS, Studio, pair_from_choice

ROOT = Path(__file__).resolve().parent
EXAMPLES_FILE = ROOT / "assets" / "prompts" / "examples.json"
DEFAULTS = dict(gamma=4, rule="dropmatch", k=5, p="auto", temperature=0.0, top_p=1.0,
                max_new_tokens=96, seed=0, run_autoregressive=True, draft_confidence=0.0,
                centroid=RuleConfig.centroid, majority_fraction=RuleConfig.majority_fraction)
RUN_TIME_LIMIT_S = 600  # a run past this is cancelled, so one user cannot hold the model forever
FIGURE_NAMES = ("agreement", "js", "acceptance", "tokens_vs_calls")

HOW_IT_WORKS = r"""
**Speculative decoding.** A small *draft* model proposes $\gamma$ tokens; the *target* scores all of
them in **one** forward pass over $\gamma+1$ positions. The longest acceptable prefix is kept, then the
target adds one token: a *correction* at the first rejected slot, or a *bonus* token when all were accepted.
With a *draft confidence* above 0, a round's draft ends early, before a token the draft itself gives less than
that probability: the target verifies what was drafted as usual (lossless output unchanged), and fewer
unlikely drafts are paid for.

**Lossless acceptance.** Greedy: accept $x_i$ iff $x_i = \arg\max p_{target}$. Sampling: accept with
probability $\min(1, p_{target}(x_i)/p_{draft}(x_i))$, else draw from $\mathrm{norm}(\max(0, p_{target}-p_{draft}))$.
The output is exactly the target's.

**DropMatch.** Monte-Carlo dropout on the LM head's input only: the transformer runs once, and the final
hidden state $h$ is perturbed $K$ times, $h^{(i)} = h \odot m^{(i)}/(1-p)$ with $m^{(i)}_j \sim \mathrm{Bernoulli}(1-p)$.
Paths are run only where the rule reads them: at drafted tokens that are *not* the clean target's top token
(the target's own choice is left to the lossless test), left to right, up to the first rejection — so the
step view shows "not run" at exact matches. The masks draw from their own random stream (derived from the
seed), so at $p = 0$ every path rule gives exactly lossless SD's output, greedy or sampled. Their logits are the clean logits minus the dropped entries' share,
$W h^{(i)} = (W h - W (h \odot (1-m^{(i)})))/(1-p)$, a sparse product whose cost grows with $p$; at large
$p$, or on a GPU, one dense matmul (bf16 where the hardware has it). The clean rows stay fp32, so the
lossless decisions are exact. Path distributions
$p^{(i)} = \mathrm{softmax}(W h^{(i)})$, path tokens $y^{(i)} = \arg\max p^{(i)}$ (each path's top token, under
greedy and sampling alike), centroid $\bar p = \frac1K \sum_i p^{(i)}$, the mean path distribution (Settings
→ centroid = *logits* uses $\mathrm{softmax}(\frac1K \sum_i l^{(i)})$ instead: sharper, and it changes decisions).
A drafted token that is not the target's choice is still accepted when
- **js**: $\mathrm{JS}(q \,\|\, \bar p) \le \max_i \mathrm{JS}(p^{(i)} \,\|\, \bar p)$ — the draft is as close to the
  centroid as the paths themselves;
- **majority**: nearly all paths chose it: at least $\lceil fK \rceil$ votes ($f = 0.8$: 4 of 5; down to a strict
  majority at $f = 0.5$), and no other token has as many;
- **dropmatch** (the paper's Algorithm 1): js, else majority, else reject.

Comparators on the same loop: **naive** (any path chose it), **typical** (Medusa:
$p_{target}(x) > \min(\epsilon, \delta e^{-H(p_{target})})$), **fixed_js** (Fuzzy SD: $\mathrm{JS}(q\|p_{target}) \le T$).
`p = auto` picks, per prompt, the largest dropout rate whose paths still agree with the clean target
on the prompt's own positions at the chosen rate (70% by default) — no data needed; the stats say when no
rate of its grid reached that agreement.

**Metrics.** *tau* = tokens emitted / verification rounds (correction or bonus included; autoregressive = 1).
*Acceptance rate* = accepted / drafted tokens. *Target calls* = prefill + rounds. *tokens/s* = new tokens /
the run's own time (prefill + rounds). *MC-head share* = the Monte-Carlo work of a round (dropout masks, the
path logits, path softmaxes, JS, votes, and p = auto's calibration) / round time. *Speedup* compares tokens/s
with an autoregressive run of the target on the same prompt, seed and pair. *Target NLL* = mean negative
log-likelihood of the emitted tokens under the clean target (temperature 1); *off-nucleus* = the share of
emitted tokens outside the target's top-p 0.95 nucleus at their position (0 for lossless greedy). Judge a
lossy rule against the target's own samples (temperature 0.7, top-p 0.95): the *Trade-offs* tab shows that
band, and NLL alone would punish any departure from greedy, even one the target likes.
"""


def load_examples() -> list[list[str]]:
    if not EXAMPLES_FILE.exists():
        return []
    return [[e["prompt"]] for e in json.loads(EXAMPLES_FILE.read_text())]


def parse_settings(prompt, gamma, rule, k, p, temperature, top_p, max_new_tokens, seed,
                   draft_confidence=DEFAULTS["draft_confidence"], centroid=DEFAULTS["centroid"],
                   majority_fraction=DEFAULTS["majority_fraction"]):
    """UI / API values -> (DecodeConfig, RuleConfig); ConfigError with one message if any is off."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("the prompt is empty; type a question or pick an example")
    decode = DecodeConfig(gamma=gamma, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, seed=seed, draft_confidence=draft_confidence)
    return decode, RuleConfig(rule=rule, num_paths=k, p=parse_p(p), centroid=centroid,
                              majority_fraction=majority_fraction)


def lossy_rule_choices() -> list[tuple[str, str]]:
    """(label, name) of every lossy rule of the one table, for the right column's dropdown."""
    from dropmatch.acceptance import RULES

    return [(rule.label, name) for name, rule in RULES.items() if rule.lossy]


def lossy_title(rule: str) -> str:
    return "### DropMatch" if rule == "dropmatch" else f"### Lossy rule: {rule}"


def write_downloads(state: Comparison) -> tuple[str, str]:
    """Trace JSON and metrics CSV of a finished comparison, in a fresh temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="dropmatch-"))
    traces = {"prompt": state.prompt, "lossless": state.lossless.trace.to_dict(),
              "lossy": state.lossy.trace.to_dict(), "autoregressive": state.ar.to_dict() if state.ar else None}
    trace_path = folder / "dropmatch_trace.json"
    trace_path.write_text(json.dumps(traces))
    metrics_path = folder / "dropmatch_metrics.csv"
    rows = [m.to_dict() for m in state.metrics() if m is not None]
    with metrics_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return str(trace_path), str(metrics_path)


def on_gpu(fn):
    """On a ZeroGPU Space (package `spaces` importable) a GPU is attached for the call; else as is."""
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=180)(fn)


def create_demo(studio: Studio) -> gr.Blocks:
    """The whole UI over one Studio. Callbacks are thin: settings -> compare_stream -> render."""

    def engine_for(preset, target_id, draft_id):
        return studio.engine(pair_from_choice(preset, target_id, draft_id))

    def figures(state: Comparison, engine):
        from dropmatch.plots import all_figures

        return all_figures(state.lossless.trace, state.lossy.trace, state.ar, engine.token_text)

    def column_html(column, engine) -> str:
        spans = token_spans(column.first_token, column.rounds, engine.token_text, engine.stop_ids)
        return text_html(spans, cursor=not column.done)

    def run_ui(prompt, preset, target_id, draft_id, gamma, rule, k, p, temperature, top_p, max_new_tokens,
               seed, run_ar, draft_confidence, centroid, majority_fraction):
        try:
            decode, rule_config = parse_settings(prompt, gamma, rule, k, p, temperature, top_p, max_new_tokens, seed,
                                                 draft_confidence, centroid, majority_fraction)
            spec = pair_from_choice(preset, target_id, draft_id)
            if not studio.is_loaded(spec):
                yield {status: f"Loading **{spec.label}** … (the first load of the embedded pair converts the "
                               "GGUF once, about 20 s)"}
            engine = studio.engine(spec)
            yield {status: "Running …", lossy_header: lossy_title(rule_config.rule),
                   lossless_out: "", lossy_out: "", lossless_stats: "", lossy_stats: ""}
            state = None
            for state in compare_stream(engine, prompt, decode, rule_config, bool(run_ar)):
                update = {lossless_out: column_html(state.lossless, engine),
                          lossy_out: column_html(state.lossy, engine)}
                if state.phase == "baseline":
                    update[status] = "Both runs done; measuring the autoregressive baseline for the speedup …"
                yield update
        except (ConfigError, RuntimeError, ValueError, OSError) as error:
            gr.Warning(str(error))
            yield {status: f"⚠️ {error}"}
            return
        except Exception as error:  # a bug of ours: say so plainly, keep the traceback in the server log
            logging.exception("run failed")
            yield {status: f"⚠️ internal error ({type(error).__name__}); the server log has the details"}
            return
        yield finished(state, engine)

    def finished(state: Comparison, engine):
        lossless_metrics, lossy_metrics = state.metrics()
        figs = figures(state, engine)
        trace_file, metrics_file = write_downloads(state)
        rounds = len(state.lossy.trace.rounds)
        note = ("Done." if state.ar is not None else "Done (autoregressive baseline off: no speedup shown).")
        return {
            status: f"{note} Same prompt, seed and pair for both columns. Hover a token for its numbers; "
                    "open *Step through* to see one round in detail.",
            lossless_out: column_html(state.lossless, engine),
            lossy_out: column_html(state.lossy, engine),
            lossless_stats: stats_html(lossless_metrics),
            lossy_stats: stats_html(lossy_metrics, p_auto=state.rule.p is None,
                                    p_auto_reached=state.lossy.trace.p_auto_reached),
            plot_agreement: figs["agreement"], plot_js: figs["js"],
            plot_acceptance: figs["acceptance"], plot_calls: figs["tokens_vs_calls"],
            step_round: gr.update(maximum=max(rounds - 1, 0), value=0, interactive=rounds > 1),
            step_out: step_html(state.lossy.trace.rounds[0], engine.token_text,
                                state.rule.majority_fraction) if rounds else "No rounds ran.",
            last_run: (state, engine.token_text),
            download_trace: trace_file, download_metrics: metrics_file,
        }

    def show_step(saved, which, index):
        if not saved:
            return "Run a comparison first."
        state, token_text = saved
        trace = state.lossy.trace if which == "lossy rule" else state.lossless.trace
        if not trace.rounds:
            return "No rounds ran."
        index = max(0, min(int(index or 0), len(trace.rounds) - 1))
        return step_html(trace.rounds[index], token_text, state.rule.majority_fraction)

    def compare_api(prompt: str, pair: str = DEFAULT_PRESET, gamma: int = DEFAULTS["gamma"],
                    rule: str = DEFAULTS["rule"], k: int = DEFAULTS["k"], p: str = DEFAULTS["p"],
                    temperature: float = DEFAULTS["temperature"], top_p: float = DEFAULTS["top_p"],
                    max_new_tokens: int = DEFAULTS["max_new_tokens"], seed: int = DEFAULTS["seed"],
                    run_autoregressive: bool = DEFAULTS["run_autoregressive"], target_id: str = "",
                    draft_id: str = "", draft_confidence: float = DEFAULTS["draft_confidence"],
                    centroid: str = DEFAULTS["centroid"], majority_fraction: float = DEFAULTS["majority_fraction"]) -> dict:
        """Lossless SD and the chosen rule on one prompt: both texts, both metric sets, the figures."""
        try:
            decode, rule_config = parse_settings(prompt, gamma, rule, k, p, temperature, top_p,
                                                 max_new_tokens, seed, draft_confidence, centroid, majority_fraction)
            engine = engine_for(pair, target_id, draft_id)
            state = None
            for state in compare_stream(engine, prompt, decode, rule_config, bool(run_autoregressive)):
                pass
        except (ConfigError, RuntimeError, ValueError, OSError) as error:
            raise gr.Error(str(error)) from None
        lossless_metrics, lossy_metrics = state.metrics()
        figs = figures(state, engine)
        return {
            "prompt": prompt,
            "rule": rule_config.rule,
            "lossless": {"text": state.lossless.trace.text, "metrics": lossless_metrics.to_dict()},
            "lossy": {"text": state.lossy.trace.text, "metrics": lossy_metrics.to_dict(), "p": state.lossy.trace.p,
                      "p_auto_reached": state.lossy.trace.p_auto_reached, "centroid": rule_config.centroid,
                      "majority_fraction": rule_config.majority_fraction},
            "autoregressive": None if state.ar is None else {"text": state.ar.text},
            "figures": {name: json.loads(figs[name].to_json()) for name in FIGURE_NAMES},
        }

    with gr.Blocks(title="DropMatch Studio") as demo:
        gr.Markdown("# DropMatch Studio\nLossless speculative decoding and **DropMatch** side by side, on the same "
                    "prompt, seed and model pair — and, token by token, why each draft token was accepted.")
        with gr.Row():
            with gr.Column(scale=3):
                prompt_box = gr.Textbox(label="Prompt", lines=4, placeholder="Ask something, or pick an example below")
                examples = load_examples()
                if examples:
                    gr.Examples(examples=examples, inputs=[prompt_box], label="Examples (GSM8K, HumanEval, MT-Bench, IFEval)")
            with gr.Column(scale=2):
                preset = gr.Dropdown(list(PRESETS), value=DEFAULT_PRESET, label="Model pair")
                target_id = gr.Textbox(label="Target hub id", visible=False, placeholder="e.g. Qwen/Qwen3-8B")
                draft_id = gr.Textbox(label="Draft hub id", visible=False, placeholder="e.g. Qwen/Qwen3-0.6B")
                with gr.Row():
                    run_button = gr.Button("Run", variant="primary", elem_id="run-button")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="stop-button")
        with gr.Accordion("Settings", open=True):
            with gr.Row():
                gamma = gr.Slider(1, 12, value=DEFAULTS["gamma"], step=1, label="draft length γ",
                                  info="fastest on the embedded CPU pair: 1; larger shows the rules at more slots")
                rule = gr.Dropdown(lossy_rule_choices(), value=DEFAULTS["rule"], label="rule (right column)")
                k = gr.Slider(1, 16, value=DEFAULTS["k"], step=1, label="K paths")
                p = gr.Textbox(value=DEFAULTS["p"], label="dropout rate p (or auto)")
            with gr.Row():
                temperature = gr.Slider(0.0, 2.0, value=DEFAULTS["temperature"], step=0.05, label="temperature (0 = greedy)")
                top_p = gr.Slider(0.05, 1.0, value=DEFAULTS["top_p"], step=0.05, label="top-p")
                max_new_tokens = gr.Slider(1, 512, value=DEFAULTS["max_new_tokens"], step=1, label="max new tokens")
                seed = gr.Number(value=DEFAULTS["seed"], precision=0, label="seed")
                run_ar = gr.Checkbox(value=DEFAULTS["run_autoregressive"], label="measure autoregressive baseline")
                draft_confidence = gr.Slider(0.0, 0.95, value=DEFAULTS["draft_confidence"], step=0.05,
                                             label="draft confidence: end a round's draft below it (0 = off)")
            with gr.Row():
                centroid = gr.Radio(list(CENTROIDS), value=DEFAULTS["centroid"], label="centroid of the paths",
                                    info="probs: mean of the path distributions (the method's); logits: softmax of the mean logits")
                majority_fraction = gr.Slider(0.5, 1.0, value=DEFAULTS["majority_fraction"], step=0.05,
                                              label="majority: share of paths that must agree",
                                              info="0.8 = 4 of 5 (\"nearly all\"); 0.5 = a strict majority")
        status = gr.Markdown("Pick an example or type a prompt, then **Run**.", elem_id="status")
        gr.HTML(legend_html())
        with gr.Row(equal_height=False):
            with gr.Column(elem_id="lossless-column"):
                gr.Markdown("### Lossless SD")
                lossless_out = gr.HTML(elem_id="lossless-text")
                lossless_stats = gr.HTML(elem_id="lossless-stats")
            with gr.Column(elem_id="lossy-column"):
                lossy_header = gr.Markdown(lossy_title(DEFAULTS["rule"]))
                lossy_out = gr.HTML(elem_id="lossy-text")
                lossy_stats = gr.HTML(elem_id="lossy-stats")
        with gr.Tabs():
            with gr.Tab("Charts"):
                with gr.Row():
                    plot_agreement = gr.Plot(label="MC-path agreement", elem_id="plot-agreement")
                    plot_js = gr.Plot(label="JS vs threshold", elem_id="plot-js")
                with gr.Row():
                    plot_acceptance = gr.Plot(label="Acceptance length", elem_id="plot-acceptance")
                    plot_calls = gr.Plot(label="Tokens vs target calls", elem_id="plot-calls")
            with gr.Tab("Step through", elem_id="step-tab"):
                with gr.Row():
                    step_column = gr.Radio(["lossy rule", "lossless"], value="lossy rule", label="column")
                    step_round = gr.Slider(0, 1, value=0, step=1, label="verification round", interactive=False)
                step_out = gr.HTML("Run a comparison first.", elem_id="step-view")
            with gr.Tab("How it works"):
                gr.Markdown(HOW_IT_WORKS, latex_delimiters=[{"left": "$", "right": "$", "display": False}])
            with gr.Tab("Downloads"):
                download_trace = gr.File(label="trace (JSON)")
                download_metrics = gr.File(label="metrics (CSV)")
        last_run = gr.State(None)

        preset.change(lambda choice: [gr.update(visible=PRESETS[choice] is None)] * 2, preset, [target_id, draft_id],
                      api_visibility="private")
        inputs = [prompt_box, preset, target_id, draft_id, gamma, rule, k, p, temperature, top_p, max_new_tokens,
                  seed, run_ar, draft_confidence, centroid, majority_fraction]
        run_event = run_button.click(on_gpu(run_ui), inputs, [
            status, lossy_header, lossless_out, lossy_out, lossless_stats, lossy_stats, plot_agreement, plot_js,
            plot_acceptance, plot_calls, step_round, step_out, last_run, download_trace, download_metrics,
        ], api_visibility="private", concurrency_id="engine", time_limit=RUN_TIME_LIMIT_S)
        stop_button.click(lambda: "Stopped.", None, status, cancels=[run_event], api_visibility="private")
        step_round.change(show_step, [last_run, step_column, step_round], step_out, api_visibility="private")
        step_column.change(show_step, [last_run, step_column, step_round], step_out, api_visibility="private")
        gr.api(on_gpu(compare_api), api_name="compare", concurrency_id="engine", time_limit=RUN_TIME_LIMIT_S)
    demo.queue(default_concurrency_limit=1, max_size=64)
    return demo


def main() -> None:
    parser = argparse.ArgumentParser(description="DropMatch Studio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--share", action="store_true")
    args = parser.parse_args()
    from dropmatch.engine import Engine
    from dropmatch.models import load_pair
    from dropmatch.studio import Policy

    studio = Studio(load_pair, Engine, Policy.from_env())
    create_demo(studio).launch(server_name=args.host, server_port=args.port, share=args.share, css=css())


if __name__ == "__main__":
    main()
