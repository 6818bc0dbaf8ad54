"""DropMatch Studio: lossless speculative decoding and DropMatch side by side.

    python app.py            # the embedded CPU pair; host and port from GRADIO_SERVER_NAME / _PORT
    python app.py --port 8080 --share

Layout first (`build_layout`), then one block that wires events (`register_listeners`) to the
module-level callbacks below. Callbacks turn settings into a Comparison (dropmatch.compare) and a
finished comparison into a `RunRecord`, plain data from which every view is drawn; only that data
lives in gr.State. The Studio (dropmatch/studio.py) owns the one loaded pair; launch starts loading
the default pair in the background. Nothing heavy happens at import time.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, fields
from pathlib import Path

import gradio as gr

from dropmatch.compare import compare_stream
from dropmatch.config import CENTROIDS, DRAFT_SOURCES, ConfigError, DecodeConfig, RuleConfig, parse_p
from dropmatch.metrics import summarize
from dropmatch import lab
from dropmatch.render import (css, lab_html, lab_summary_html, legend_html, stats_html, step_html, text_html,
                              token_spans)
from dropmatch.studio import DEFAULT_PRESET, PRESETS, Studio, pair_from_choice
from dropmatch.trace import GenerationTrace

ROOT = Path(__file__).resolve().parent
EXAMPLES_FILE = ROOT / "assets" / "prompts" / "examples.json"
FRONTIER_FILE = ROOT / "assets" / "results" / "frontier.json"
RECORDED_DIR = ROOT / "assets" / "recorded"
RUN_FORMAT, RUN_VERSION = "dropmatch-run", 2  # the Downloads trace file: what "Open a recorded run" reads
DEFAULTS = dict(gamma="auto", draft_source="hybrid", rule="dropmatch", k=5, p="auto", temperature=0.0, top_p=1.0,
                max_new_tokens=96, seed=0, run_autoregressive=True, draft_confidence=0.0,
                centroid=RuleConfig.centroid, majority_fraction=RuleConfig.majority_fraction)
RUN_TIME_LIMIT_S = 600  # a run past this is cancelled, so one user cannot hold the model forever
FIGURE_NAMES = ("agreement", "js", "acceptance", "tokens_vs_calls")
KEEP_DOWNLOADS = 32  # the newest runs' files kept in the server's one downloads folder

HOW_IT_WORKS = r"""
**Speculative decoding.** A small *draft* model proposes $\gamma$ tokens; the *target* scores all of
them in **one** forward pass over $\gamma+1$ positions. The longest acceptable prefix is kept, then the
target adds one token: a *correction* at the first rejected slot, or a *bonus* token when all were accepted.
With a *draft confidence* above 0, a round's draft ends early, before a token the draft itself gives less than
that probability: the target verifies what was drafted as usual (lossless output unchanged), and fewer
unlikely drafts are paid for.

**Draft length and source.** With γ = *auto* each round drafts the length with the most expected tokens
per second, $(1 + \sum_{k \le \gamma} \prod_{i \le k} a_i) / (\gamma\, c_{draft} + c_{verify}(\gamma + 1))$: $a_i$ is
this generation's running acceptance at slot $i$ (0.5 until it has data), and the costs were timed on this
machine for this pair when it was first used. *Drafts from ngram* (prompt lookup) proposes the tokens that
followed the latest earlier occurrence of the text's last 1-3 tokens, at no model cost; *hybrid* uses a lookup
of 2 or more tokens where one exists and the draft model elsewhere. A lookup token's draft distribution is
one-hot, so the lossless tests below stay exact (sampling accepts it with probability $p_{target}(x)$), and the
JS rule compares that one-hot $q$ with the paths' centroid: it accepts a lookup token only where the paths put
nearly all their mass on it. Hover a token to see who drafted it.

**Lossless acceptance.** Greedy: accept $x_i$ iff $x_i = \arg\max p_{target}$. Sampling: accept with
probability $\min(1, p_{target}(x_i)/p_{draft}(x_i))$, else draw from $\mathrm{norm}(\max(0, p_{target}-p_{draft}))$.
The output is exactly the target's.

**DropMatch.** Monte-Carlo dropout on the LM head's input only: the transformer runs once, and the final
hidden state $h$ is perturbed $K$ times, $h^{(i)} = h \odot m^{(i)}/(1-p)$ with $m^{(i)}_j \sim \mathrm{Bernoulli}(1-p)$.
Paths are run only where the rule reads them: at drafted tokens that are *not* the clean target's top token
(the target's own choice is left to the lossless test), left to right, up to the first rejection — so the
step view shows "not run" at exact matches. Each drafted position's masks come from a random stream keyed by
the seed and the position alone (apart from sampling's), so at $p = 0$ every path rule gives exactly lossless
SD's output, greedy or sampled, and the rule lab re-judges with the very paths the run drew. Their logits are
the clean logits minus the dropped entries' share,
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
on the prompt's own positions at the chosen rate (50% by default, chosen on training-side prompts) — no data needed; the stats say when no
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


# ---------------------------------------------------------------- settings and records


@dataclass(frozen=True)
class Settings:
    """The Run button's inputs, in the order of Ui.setting_components()."""

    prompt: str
    preset: str
    target_id: str
    draft_id: str
    gamma: int
    rule: str
    k: int
    p: str
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    run_autoregressive: bool
    draft_confidence: float
    centroid: str
    majority_fraction: float
    draft_source: str

    def parse(self) -> tuple[DecodeConfig, RuleConfig]:
        return parse_settings(self.prompt, self.gamma, self.rule, self.k, self.p, self.temperature, self.top_p,
                              self.max_new_tokens, self.seed, self.draft_confidence, self.centroid,
                              self.majority_fraction, self.draft_source)


def parse_settings(prompt, gamma, rule, k, p, temperature, top_p, max_new_tokens, seed,
                   draft_confidence=DEFAULTS["draft_confidence"], centroid=DEFAULTS["centroid"],
                   majority_fraction=DEFAULTS["majority_fraction"], draft_source=DEFAULTS["draft_source"]):
    """UI / API values -> (DecodeConfig, RuleConfig); ConfigError with one message if any is off."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("the prompt is empty; type a question or pick an example")
    decode = DecodeConfig(**DecodeConfig.parse_gamma(gamma), max_new_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, seed=seed, draft_confidence=draft_confidence, draft_source=draft_source)
    return decode, RuleConfig(rule=rule, num_paths=k, p=parse_p(p), centroid=centroid,
                              majority_fraction=majority_fraction)


@dataclass(frozen=True)
class RunRecord:
    """A finished comparison as plain data: the three traces, the text of every token id they
    mention and the rule lab's matrix at the run's own settings, so that every view (columns, stats,
    charts, step view, rule lab) is drawn without a model."""

    prompt: str
    rule: str
    p_auto: bool
    lossless: GenerationTrace
    lossy: GenerationTrace
    ar: GenerationTrace | None
    tokens: dict[int, str]
    lab: dict | None = None

    def token_text(self, token: int) -> str:
        return self.tokens.get(token, f"<{token}>")

    def metrics(self):
        return summarize(self.lossless, ar=self.ar), summarize(self.lossy, ar=self.ar, lossless=self.lossless)

    def to_dict(self) -> dict:
        return {"format": RUN_FORMAT, "version": RUN_VERSION, "prompt": self.prompt, "rule": self.rule,
                "p_auto": self.p_auto, "lossless": self.lossless.to_dict(), "lossy": self.lossy.to_dict(),
                "autoregressive": self.ar.to_dict() if self.ar else None,
                "tokens": {str(k): v for k, v in self.tokens.items()}, "lab": self.lab}

    @staticmethod
    def from_dict(data) -> "RunRecord":
        """A recorded run from its JSON; ConfigError with one line for an old or foreign file."""
        if not isinstance(data, dict) or data.get("format") != RUN_FORMAT:
            raise ConfigError("this file is not a DropMatch Studio run (its trace JSON from Downloads)")
        if data.get("version") != RUN_VERSION:
            raise ConfigError(f"this run was written in format version {data.get('version')!r}; this app reads "
                              f"version {RUN_VERSION}: record it again")
        try:
            ar = data["autoregressive"]
            return RunRecord(data["prompt"], data["rule"], bool(data["p_auto"]),
                             GenerationTrace.from_dict(data["lossless"]), GenerationTrace.from_dict(data["lossy"]),
                             None if ar is None else GenerationTrace.from_dict(ar),
                             {int(k): v for k, v in data["tokens"].items()}, data.get("lab"))
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"this run file is damaged ({type(error).__name__}: {error})") from None


def read_recorded_run(path) -> RunRecord:
    """A RunRecord from a trace JSON file; ConfigError with one line for anything else."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise ConfigError("this file is not a DropMatch Studio run (not readable JSON)") from None
    return RunRecord.from_dict(data)


def recorded_runs() -> dict[str, Path]:
    """The runs shipped in assets/recorded, by their title (the file name, spaced)."""
    if not RECORDED_DIR.exists():
        return {}
    return {p.stem.replace("_", " "): p for p in sorted(RECORDED_DIR.glob("*.json"))}


def mentioned_tokens(*traces: GenerationTrace | None) -> set[int]:
    """Every token id a trace's views may show: outputs, drafts, targets, paths, top lists."""
    ids: set[int] = set()
    for trace in traces:
        if trace is None:
            continue
        ids.update(trace.output_ids)
        ids.add(trace.first_token)
        for r in trace.rounds:
            ids.add(r.context_token)
            ids.update(r.emitted)
            for d in r.drafted:
                ids.update((d.token, d.target_token, *d.path_tokens))
                if d.majority_token is not None:
                    ids.add(d.majority_token)
                ids.update(t for t, _ in (*d.draft_top, *d.target_top))
                ids.update(t for top in d.path_top for t, _ in top)
    ids.discard(-1)
    return ids


def record_of(state, engine) -> RunRecord:
    """The RunRecord of a finished Comparison (the engine names the tokens and its heads give the
    rule lab's matrix at the run's own settings)."""
    lossless, lossy, ar = state.lossless.trace, state.lossy.trace, state.ar
    tokens = {token: engine.token_text(token) for token in sorted(mentioned_tokens(lossless, lossy, ar))}
    matrix = lab_matrix(engine, lossless, lab.lab_settings(lossy)) if lab.has_states(lossless) else None
    return RunRecord(state.prompt, state.rule.rule, state.rule.p is None, lossless, lossy, ar, tokens, matrix)


def lab_matrix(engine, trace: GenerationTrace, settings: RuleConfig) -> dict:
    """The rule lab's matrix for a run's drafts (its kept states) through the engine's heads."""
    prepared = lab.prepare(trace, engine.target, engine.draft)
    return lab.rejudge(prepared, engine.target, lab.decode_of(trace), settings, engine.token_text)


# ---------------------------------------------------------------- files


class Downloads:
    """The server's one folder for the Downloads tab: each run's trace JSON and metrics CSV, the newest
    KEEP_DOWNLOADS runs kept, the rest removed; the folder goes when the server ends."""

    def __init__(self, folder: Path | None = None, keep: int = KEEP_DOWNLOADS):
        self.folder = folder or Path(tempfile.mkdtemp(prefix="dropmatch-downloads-"))
        self.keep = keep
        self._lock = threading.Lock()

    def write(self, record: RunRecord) -> tuple[str, str]:
        with self._lock:
            run = self.folder / uuid.uuid4().hex[:12]
            run.mkdir(parents=True)
            trace_path = run / "dropmatch_trace.json"
            trace_path.write_text(json.dumps(record.to_dict()))
            metrics_path = run / "dropmatch_metrics.csv"
            rows = [m.to_dict() for m in record.metrics()]
            with metrics_path.open("w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
            runs = sorted((p for p in self.folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
            for old in runs[: max(0, len(runs) - self.keep)]:
                shutil.rmtree(old, ignore_errors=True)
            return str(trace_path), str(metrics_path)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


# ---------------------------------------------------------------- views


def load_examples() -> list[list[str]]:
    if not EXAMPLES_FILE.exists():
        return []
    return [[e["prompt"]] for e in json.loads(EXAMPLES_FILE.read_text())]


def lossy_rule_choices() -> list[tuple[str, str]]:
    """(label, name) of every lossy rule of the one table, for the right column's dropdown."""
    from dropmatch.acceptance import RULES

    return [(rule.label, name) for name, rule in RULES.items() if rule.lossy]


def lossy_title(rule: str) -> str:
    return "### DropMatch" if rule == "dropmatch" else f"### Lossy rule: {rule}"


def column_html(column, engine) -> str:
    spans = token_spans(column.first_token, column.rounds, engine.token_text, engine.stop_ids)
    return text_html(spans, cursor=not column.done)


def trace_html(trace: GenerationTrace, record: RunRecord) -> str:
    stop_ids = frozenset(trace.output_ids[-1:]) if trace.stop_reason == "eos" else frozenset()
    return text_html(token_spans(trace.first_token, list(trace.rounds), record.token_text, stop_ids))


def figures_of(record: RunRecord) -> dict:
    from dropmatch.plots import all_figures

    return all_figures(record.lossless, record.lossy, record.ar, record.token_text)


def load_frontier(path: Path = FRONTIER_FILE) -> dict | None:
    """The shipped benchmark document with a frontier (bench --frontier), or None."""
    if not path.exists():
        return None
    document = json.loads(path.read_text())
    return document if document.get("frontier") else None


def tradeoff_figure(record: RunRecord | None, frontier: dict | None):
    """The shipped frontier (all prompts) with this run's point on it."""
    from dropmatch.plots import frontier_figure

    if frontier is None:
        return frontier_figure([], None, None)
    points = [p for p in frontier["frontier"] if p["benchmark"] == "all"]
    current = None
    if record is not None:
        lossless, lossy = record.metrics()
        if lossless.tau and lossy.tau:
            current = {"tau_gain": lossy.tau / lossless.tau - 1, "target_nll": lossy.target_nll,
                       "off_nucleus_rate": lossy.off_nucleus_rate, "label": f"this run ({record.rule})"}
    reference = (frontier.get("reference") or {}).get("target_sampled")
    return frontier_figure(points, frontier["rules"].get("lossless"), reference, current,
                           title="Trade-off frontier of the embedded pair (shipped benchmark) and this run")


def finished_view(record: RunRecord, downloads: Downloads, recorded_from: str | None = None) -> dict:
    """Every output of a finished run (or of a recorded one, `recorded_from` naming it), by Ui field name."""
    lossless_metrics, lossy_metrics = record.metrics()
    figs = figures_of(record)
    trace_file, metrics_file = downloads.write(record)
    rounds = len(record.lossy.rounds)
    if recorded_from is not None:
        prompt = record.prompt if len(record.prompt) <= 120 else record.prompt[:117] + "…"
        note = (f"Recorded run *{recorded_from}* ({record.lossless.target_name} + {record.lossless.draft_name}), "
                f"prompt: “{prompt}”; no model ran.")
    else:
        note = "Done." if record.ar is not None else "Done (autoregressive baseline off: no speedup shown)."
    return {
        "status": f"{note} Same prompt, seed and pair for both columns. Hover a token for its numbers; "
                  "open *Step through* to see one round in detail.",
        "lossy_header": lossy_title(record.rule),
        "lossless_out": trace_html(record.lossless, record),
        "lossy_out": trace_html(record.lossy, record),
        "lossless_stats": stats_html(lossless_metrics),
        "lossy_stats": stats_html(lossy_metrics, p_auto=record.p_auto, p_auto_reached=record.lossy.p_auto_reached),
        "plot_agreement": figs["agreement"], "plot_js": figs["js"],
        "plot_acceptance": figs["acceptance"], "plot_calls": figs["tokens_vs_calls"],
        "plot_tradeoff": tradeoff_figure(record, load_frontier()),
        "step_round": gr.update(maximum=max(rounds - 1, 0), value=0, interactive=rounds > 1),
        "step_out": step_html(record.lossy.rounds[0], record.token_text, record.lossy.majority_fraction)
        if rounds else "No rounds ran.",
        "last_run": record,
        "download_trace": trace_file, "download_metrics": metrics_file,
        **lab_view(record),
    }


def lab_view(record: RunRecord) -> dict:
    """The rule lab at the run's own settings (the matrix the run recorded), controls set to them."""
    if record.lab is None:
        return {"lab_out": "", "lab_summary": "", "lab_matrix": None,
                "lab_status": "This run kept no states for the rule lab (record it again with this version)."}
    settings = record.lab["settings"]
    return {"lab_out": lab_html(record.lab), "lab_summary": lab_summary_html(record.lab), "lab_matrix": record.lab,
            "lab_disagreements": False,
            "lab_status": f"The lossless column's {len(record.lab['rows'])} drafted tokens under every rule, at the "
                          "run's own settings. Move a control to re-judge them.",
            "lab_k": settings["num_paths"], "lab_p": settings["p"], "lab_fraction": settings["majority_fraction"],
            "lab_centroid": settings["centroid"], "lab_fixed_js": settings["fixed_js_threshold"],
            "lab_typical_eps": settings["typical_eps"]}


# ---------------------------------------------------------------- callbacks


def stream_comparison(engine, prompt: str, decode: DecodeConfig, rule: RuleConfig, run_ar: bool):
    """The generation itself (what runs inside a ZeroGPU call): partial views while both columns
    grow, then the RunRecord (plain data, nothing on the device)."""
    state = None
    for state in compare_stream(engine, prompt, decode, rule, run_ar):
        update = {"lossless_out": column_html(state.lossless, engine), "lossy_out": column_html(state.lossy, engine)}
        if state.phase == "baseline":
            update["status"] = "Both runs done; measuring the autoregressive baseline for the speedup …"
        yield update
    yield record_of(state, engine)


def run_comparison(studio: Studio, downloads: Downloads, settings: Settings):
    """Yields partial views (by Ui field name) while both columns grow, then the finished view.
    The pair loads outside the GPU call (on_gpu wraps the generation only)."""
    try:
        decode, rule = settings.parse()
        spec = pair_from_choice(settings.preset, settings.target_id, settings.draft_id)
        if not studio.is_loaded(spec):
            yield {"status": f"Loading **{spec.label}** … (the first load of the embedded pair converts the "
                             "GGUF once, about 20 s)"}
        engine = studio.engine(spec)
        yield {"status": "Running …", "lossy_header": lossy_title(rule.rule), "load_timer": gr.Timer(active=False),
               "lossless_out": "", "lossy_out": "", "lossless_stats": "", "lossy_stats": ""}
        record = None
        generation = on_gpu(stream_comparison)(engine, settings.prompt, decode, rule, bool(settings.run_autoregressive))
        for item in studio.iterate(generation):
            if isinstance(item, RunRecord):
                record = item
            else:
                yield item
    except (ConfigError, RuntimeError, ValueError, OSError) as error:
        gr.Warning(str(error))
        yield {"status": f"⚠️ {error}"}
        return
    except Exception as error:  # a bug of ours: say so plainly, keep the traceback in the server log
        logging.exception("run failed")
        yield {"status": f"⚠️ internal error ({type(error).__name__}); the server log has the details"}
        return
    yield finished_view(record, downloads)


def open_recorded(downloads: Downloads, path, title: str | None = None) -> dict:
    """The views of a recorded run (an uploaded file or a shipped one); one clear message otherwise."""
    if not path:
        return {}
    try:
        record = read_recorded_run(path)
    except ConfigError as error:
        return {"status": f"⚠️ {error}"}
    return finished_view(record, downloads, recorded_from=title or Path(str(path)).name)


def show_step(record: RunRecord | None, which: str, index) -> str:
    if record is None:
        return "Run a comparison first."
    trace = record.lossy if which == "lossy rule" else record.lossless
    if not trace.rounds:
        return "No rounds ran."
    index = max(0, min(int(index or 0), len(trace.rounds) - 1))
    return step_html(trace.rounds[index], record.token_text, trace.majority_fraction)


def rejudge_view(studio: Studio, record: RunRecord | None, k, p, fraction, centroid, fixed_js, typical_eps,
                 disagreements_only: bool = False) -> dict:
    """The rule lab re-judged at the controls' settings, through the heads of the pair in memory."""
    if record is None:
        return {"lab_status": "Run a comparison (or open a recorded run) first."}
    if not lab.has_states(record.lossless):
        return {"lab_status": "This run kept no states for the rule lab (record it again with this version)."}
    try:
        settings = lab.lab_settings(None, num_paths=k, p=p, majority_fraction=fraction, centroid=centroid,
                                    fixed_js_threshold=fixed_js, typical_eps=typical_eps)
    except ConfigError as error:
        return {"lab_status": f"⚠️ {error}"}
    engine = studio.loaded_engine()
    names = (record.lossless.target_name, record.lossless.draft_name)
    if engine is None or (engine.target.name, engine.draft.name) != names:
        return {"lab_status": f"Re-judging reads the heads of this run's pair ({names[0]} + {names[1]}), which is not "
                              f"in memory now ({studio.status.line()}); the matrix shows the run's own settings. "
                              "Run that pair once (or wait for it to load), then move a control again."}
    start = time.perf_counter()
    matrix = studio.call(lab_matrix, engine, record.lossless, settings)
    seconds = time.perf_counter() - start
    return {"lab_out": lab_html(matrix, disagreements_only), "lab_summary": lab_summary_html(matrix),
            "lab_matrix": matrix,
            "lab_status": f"Re-judged {len(matrix['rows'])} drafted tokens under {len(matrix['rules'])} rules in "
                          f"{seconds:.2f} s through the heads only (no transformer block ran)."}


def compare_api(studio: Studio, prompt: str, pair: str = DEFAULT_PRESET, gamma: str = DEFAULTS["gamma"],
                rule: str = DEFAULTS["rule"], k: int = DEFAULTS["k"], p: str = DEFAULTS["p"],
                temperature: float = DEFAULTS["temperature"], top_p: float = DEFAULTS["top_p"],
                max_new_tokens: int = DEFAULTS["max_new_tokens"], seed: int = DEFAULTS["seed"],
                run_autoregressive: bool = DEFAULTS["run_autoregressive"], target_id: str = "",
                draft_id: str = "", draft_confidence: float = DEFAULTS["draft_confidence"],
                centroid: str = DEFAULTS["centroid"], majority_fraction: float = DEFAULTS["majority_fraction"],
                draft_source: str = DEFAULTS["draft_source"]) -> dict:
    """Lossless SD and the chosen rule on one prompt: both texts, both metric sets, the figures, the rule lab."""
    try:
        decode, rule_config = parse_settings(prompt, str(gamma), rule, k, p, temperature, top_p, max_new_tokens,
                                             seed, draft_confidence, centroid, majority_fraction, draft_source)
        engine = studio.engine(pair_from_choice(pair, target_id, draft_id))  # outside the GPU call
        *_, record = studio.iterate(on_gpu(stream_comparison)(engine, prompt, decode, rule_config, bool(run_autoregressive)))
    except (ConfigError, RuntimeError, ValueError, OSError) as error:
        raise gr.Error(str(error)) from None
    lossless_metrics, lossy_metrics = record.metrics()
    figs = figures_of(record)
    return {
        "prompt": prompt,
        "rule": rule_config.rule,
        "lossless": {"text": record.lossless.text, "metrics": lossless_metrics.to_dict()},
        "lossy": {"text": record.lossy.text, "metrics": lossy_metrics.to_dict(), "p": record.lossy.p,
                  "p_auto_reached": record.lossy.p_auto_reached, "centroid": rule_config.centroid,
                  "majority_fraction": rule_config.majority_fraction},
        "autoregressive": None if record.ar is None else {"text": record.ar.text},
        "figures": {name: json.loads(figs[name].to_json()) for name in FIGURE_NAMES},
        "lab": record.lab,
    }


def load_status_view(studio: Studio) -> tuple:
    """(status line, timer) while the pair loads in the background: the seconds so far, then the
    outcome once, and the timer stops."""
    status = studio.status
    if status.state == "loading":
        return status.line(), gr.Timer(active=True)
    if status.state == "ready":
        return status.line() + " Pick an example or type a prompt, then **Run**.", gr.Timer(active=False)
    if status.state == "failed":
        return status.line(), gr.Timer(active=False)
    return gr.update(), gr.Timer(active=False)


def on_gpu(fn):
    """On a ZeroGPU Space (package `spaces` importable) a GPU is attached for the call; else as is.
    Hugging Face's pattern: weights load outside the call (the Studio, at launch or on first use),
    only the generation runs inside, and what it returns holds nothing on the device."""
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=180)(fn)


# ---------------------------------------------------------------- layout


@dataclass
class Ui:
    """Every component the callbacks read or write, by name."""

    prompt: gr.Textbox
    preset: gr.Dropdown
    target_id: gr.Textbox
    draft_id: gr.Textbox
    gamma: gr.Dropdown
    draft_source: gr.Radio
    rule: gr.Dropdown
    k: gr.Slider
    p: gr.Textbox
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Slider
    seed: gr.Number
    run_autoregressive: gr.Checkbox
    draft_confidence: gr.Slider
    centroid: gr.Radio
    majority_fraction: gr.Slider
    run_button: gr.Button
    stop_button: gr.Button
    status: gr.Markdown
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
    step_column: gr.Radio
    step_round: gr.Slider
    step_out: gr.HTML
    download_trace: gr.File
    download_metrics: gr.File
    recorded_choice: gr.Dropdown
    recorded_upload: gr.File
    lab_k: gr.Slider
    lab_p: gr.Slider
    lab_fraction: gr.Slider
    lab_centroid: gr.Radio
    lab_fixed_js: gr.Slider
    lab_typical_eps: gr.Slider
    lab_status: gr.Markdown
    lab_out: gr.HTML
    lab_summary: gr.HTML
    lab_disagreements: gr.Checkbox
    lab_matrix: gr.State
    last_run: gr.State
    load_timer: gr.Timer

    def setting_components(self) -> list:
        return [getattr(self, f.name) for f in fields(Settings)]

    def view_components(self) -> list:
        names = ("status", "lossy_header", "lossless_out", "lossy_out", "lossless_stats", "lossy_stats",
                 "plot_agreement", "plot_js", "plot_acceptance", "plot_calls", "plot_tradeoff", "step_round",
                 "step_out", "last_run", "download_trace", "download_metrics", "load_timer", *self.lab_names())
        return [getattr(self, name) for name in names]

    @staticmethod
    def lab_names() -> tuple[str, ...]:
        return ("lab_k", "lab_p", "lab_fraction", "lab_centroid", "lab_fixed_js", "lab_typical_eps", "lab_status",
                "lab_out", "lab_summary", "lab_matrix", "lab_disagreements")

    def lab_controls(self) -> list:
        return [self.lab_k, self.lab_p, self.lab_fraction, self.lab_centroid, self.lab_fixed_js, self.lab_typical_eps]

    def bind(self, view: dict) -> dict:
        """A view by field name -> a Gradio update by component."""
        return {getattr(self, name): value for name, value in view.items()}


def build_layout() -> Ui:
    """The components, top to bottom; no event is wired here."""
    parts = {}
    gr.Markdown("# DropMatch Studio\nLossless speculative decoding and **DropMatch** side by side, on the same "
                "prompt, seed and model pair — and, token by token, why each draft token was accepted.")
    with gr.Row():
        with gr.Column(scale=3):
            parts["prompt"] = gr.Textbox(label="Prompt", lines=4, placeholder="Ask something, or pick an example below")
            examples = load_examples()
            if examples:
                gr.Examples(examples=examples, inputs=[parts["prompt"]],
                            label="Examples (GSM8K, HumanEval, MT-Bench, IFEval)")
        with gr.Column(scale=2):
            parts["preset"] = gr.Dropdown(list(PRESETS), value=DEFAULT_PRESET, label="Model pair")
            parts["target_id"] = gr.Textbox(label="Target hub id", visible=False, placeholder="e.g. Qwen/Qwen3-8B")
            parts["draft_id"] = gr.Textbox(label="Draft hub id", visible=False, placeholder="e.g. Qwen/Qwen3-0.6B")
            with gr.Row():
                parts["run_button"] = gr.Button("Run", variant="primary", elem_id="run-button")
                parts["stop_button"] = gr.Button("Stop", variant="stop", elem_id="stop-button")
    with gr.Accordion("Settings", open=True):
        with gr.Row():
            parts["gamma"] = gr.Dropdown(["auto", *map(str, range(1, 13))], value=DEFAULTS["gamma"],
                                         label="draft length γ",
                                         info="auto: each round drafts the length with the most expected tokens "
                                              "per second (costs measured here)")
            parts["draft_source"] = gr.Radio(list(DRAFT_SOURCES), value=DEFAULTS["draft_source"], label="drafts from",
                                             info="model: the draft model; ngram: prompt lookup (free); hybrid: "
                                                  "lookup where the text repeats, the model elsewhere")
            parts["rule"] = gr.Dropdown(lossy_rule_choices(), value=DEFAULTS["rule"], label="rule (right column)")
            parts["k"] = gr.Slider(1, 16, value=DEFAULTS["k"], step=1, label="K paths")
            parts["p"] = gr.Textbox(value=DEFAULTS["p"], label="dropout rate p (or auto)")
        with gr.Row():
            parts["temperature"] = gr.Slider(0.0, 2.0, value=DEFAULTS["temperature"], step=0.05,
                                             label="temperature (0 = greedy)")
            parts["top_p"] = gr.Slider(0.05, 1.0, value=DEFAULTS["top_p"], step=0.05, label="top-p")
            parts["max_new_tokens"] = gr.Slider(1, 512, value=DEFAULTS["max_new_tokens"], step=1, label="max new tokens")
            parts["seed"] = gr.Number(value=DEFAULTS["seed"], precision=0, label="seed")
            parts["run_autoregressive"] = gr.Checkbox(value=DEFAULTS["run_autoregressive"],
                                                      label="measure autoregressive baseline")
            parts["draft_confidence"] = gr.Slider(0.0, 0.95, value=DEFAULTS["draft_confidence"], step=0.05,
                                                  label="draft confidence: end a round's draft below it (0 = off)")
        with gr.Row():
            parts["centroid"] = gr.Radio(list(CENTROIDS), value=DEFAULTS["centroid"], label="centroid of the paths",
                                         info="probs: mean of the path distributions (the method's); "
                                              "logits: softmax of the mean logits")
            parts["majority_fraction"] = gr.Slider(0.5, 1.0, value=DEFAULTS["majority_fraction"], step=0.05,
                                                   label="majority: share of paths that must agree",
                                                   info="0.8 = 4 of 5 (\"nearly all\"); 0.5 = a strict majority")
    parts["status"] = gr.Markdown("Pick an example or type a prompt, then **Run**.", elem_id="status")
    parts["load_timer"] = gr.Timer(1.0)
    gr.HTML(legend_html())
    with gr.Row(equal_height=False):
        with gr.Column(elem_id="lossless-column"):
            gr.Markdown("### Lossless SD")
            parts["lossless_out"] = gr.HTML(elem_id="lossless-text")
            parts["lossless_stats"] = gr.HTML(elem_id="lossless-stats")
        with gr.Column(elem_id="lossy-column"):
            parts["lossy_header"] = gr.Markdown(lossy_title(DEFAULTS["rule"]))
            parts["lossy_out"] = gr.HTML(elem_id="lossy-text")
            parts["lossy_stats"] = gr.HTML(elem_id="lossy-stats")
    with gr.Tabs():
        with gr.Tab("Charts"):
            with gr.Row():
                parts["plot_agreement"] = gr.Plot(label="MC-path agreement", elem_id="plot-agreement")
                parts["plot_js"] = gr.Plot(label="JS vs threshold", elem_id="plot-js")
            with gr.Row():
                parts["plot_acceptance"] = gr.Plot(label="Acceptance length", elem_id="plot-acceptance")
                parts["plot_calls"] = gr.Plot(label="Tokens vs target calls", elem_id="plot-calls")
        with gr.Tab("Step through", elem_id="step-tab"):
            with gr.Row():
                parts["step_column"] = gr.Radio(["lossy rule", "lossless"], value="lossy rule", label="column")
                parts["step_round"] = gr.Slider(0, 1, value=0, step=1, label="verification round", interactive=False)
            parts["step_out"] = gr.HTML("Run a comparison first.", elem_id="step-view")
        with gr.Tab("Rule lab", elem_id="lab-tab"):
            gr.Markdown("The lossless column's drafted tokens (the same drafts, the same clean target) judged by every "
                        "rule at once, re-judged through the models' heads when you move a control. The totals under "
                        "the matrix are counterfactuals on these fixed drafts; the columns above are real runs. "
                        "✓ accepted (colour: why), ✗ rejected, · not reached; hover a cell for the numbers the rule read.")
            with gr.Row():
                parts["lab_k"] = gr.Slider(1, 16, value=5, step=1, label="K paths", elem_id="lab-k")
                parts["lab_p"] = gr.Slider(0.0, 0.5, value=0.1, step=0.01, label="dropout rate p", elem_id="lab-p")
                parts["lab_fraction"] = gr.Slider(0.5, 1.0, value=0.8, step=0.05, label="majority: share of paths")
                parts["lab_centroid"] = gr.Radio(list(CENTROIDS), value="probs", label="centroid")
                parts["lab_fixed_js"] = gr.Slider(0.0, 0.69, value=RuleConfig.fixed_js_threshold, step=0.01,
                                                  label="fixed-JS threshold T")
                parts["lab_typical_eps"] = gr.Slider(0.0, 0.5, value=RuleConfig.typical_eps, step=0.01,
                                                     label="typical ε")
            with gr.Row():
                parts["lab_status"] = gr.Markdown("Run a comparison (or open a recorded run) first.",
                                                  elem_id="lab-status")
                parts["lab_disagreements"] = gr.Checkbox(False, label="only tokens where the rules disagree",
                                                         elem_id="lab-disagreements")
            parts["lab_summary"] = gr.HTML(elem_id="lab-summary")
            parts["lab_out"] = gr.HTML(elem_id="lab-matrix")
        with gr.Tab("Trade-offs", elem_id="tradeoff-tab"):
            gr.Markdown("Each lossy rule swept over its knob on the same prompts (the shipped benchmark of the "
                        "embedded pair): how many more tokens a round keeps (tau gain over lossless SD) against "
                        "the quality the target itself sees. Shaded: where the target's own samples (temperature "
                        "0.7, top-p 0.95) lie. The star is your last run.")
            parts["plot_tradeoff"] = gr.Plot(label="Trade-off frontier", elem_id="plot-tradeoff")
        with gr.Tab("How it works"):
            gr.Markdown(HOW_IT_WORKS, latex_delimiters=[{"left": "$", "right": "$", "display": False}])
        with gr.Tab("Downloads"):
            parts["download_trace"] = gr.File(label="trace (JSON)")
            parts["download_metrics"] = gr.File(label="metrics (CSV)")
        with gr.Tab("Recorded runs", elem_id="recorded-tab"):
            gr.Markdown("Open a run recorded earlier (a trace JSON from *Downloads*, or one shipped with the app): "
                        "both columns, the stats, every chart and the step view, without loading a model.")
            with gr.Row():
                parts["recorded_choice"] = gr.Dropdown(list(recorded_runs()), value=None, label="shipped runs",
                                                       elem_id="recorded-choice")
                parts["recorded_upload"] = gr.File(label="open a recorded run (trace JSON)", file_types=[".json"],
                                                   elem_id="recorded-upload")
    parts["last_run"] = gr.State(None)
    parts["lab_matrix"] = gr.State(None)
    return Ui(**parts)


# ---------------------------------------------------------------- wiring


def register_listeners(demo: gr.Blocks, ui: Ui, studio: Studio, downloads: Downloads) -> None:
    """Every event of the app, in one place."""

    def on_run(*values):
        for view in run_comparison(studio, downloads, Settings(*values)):
            yield ui.bind(view)

    def on_compare(prompt: str, pair: str = DEFAULT_PRESET, gamma: str = DEFAULTS["gamma"],
                   rule: str = DEFAULTS["rule"], k: int = DEFAULTS["k"], p: str = DEFAULTS["p"],
                   temperature: float = DEFAULTS["temperature"], top_p: float = DEFAULTS["top_p"],
                   max_new_tokens: int = DEFAULTS["max_new_tokens"], seed: int = DEFAULTS["seed"],
                   run_autoregressive: bool = DEFAULTS["run_autoregressive"], target_id: str = "",
                   draft_id: str = "", draft_confidence: float = DEFAULTS["draft_confidence"],
                   centroid: str = DEFAULTS["centroid"],
                   majority_fraction: float = DEFAULTS["majority_fraction"],
                   draft_source: str = DEFAULTS["draft_source"]) -> dict:
        """Lossless SD and the chosen rule on one prompt: both texts, both metric sets, the figures, the rule lab."""
        return compare_api(studio, prompt, pair, gamma, rule, k, p, temperature, top_p, max_new_tokens, seed,
                           run_autoregressive, target_id, draft_id, draft_confidence, centroid, majority_fraction,
                           draft_source)

    def on_tick():
        return load_status_view(studio)

    def on_first_visit():
        """A shipped run at once, while the pair loads in the background; else the frontier alone."""
        shipped = recorded_runs()
        if shipped:
            title = next(iter(shipped))
            return ui.bind(open_recorded(downloads, shipped[title], title))
        return ui.bind({"plot_tradeoff": tradeoff_figure(None, load_frontier())})

    ui.preset.change(lambda choice: [gr.update(visible=PRESETS[choice] is None)] * 2, ui.preset,
                     [ui.target_id, ui.draft_id], api_visibility="private")
    # A shipped run is shown at once on first visit; a Run cancels that display if it is still on its way.
    first_visit = demo.load(on_first_visit, None, ui.view_components(), api_visibility="private")
    run_event = ui.run_button.click(on_run, ui.setting_components(), ui.view_components(), cancels=[first_visit],
                                    api_visibility="private", concurrency_id="engine", time_limit=RUN_TIME_LIMIT_S)
    ui.stop_button.click(lambda: "Stopped.", None, ui.status, cancels=[run_event], api_visibility="private")
    for trigger in (ui.step_round, ui.step_column):
        trigger.change(show_step, [ui.last_run, ui.step_column, ui.step_round], ui.step_out, api_visibility="private")
    ui.load_timer.tick(on_tick, None, [ui.status, ui.load_timer], api_visibility="private")

    def on_lab(record, *controls):
        return ui.bind(rejudge_view(studio, record, *controls))

    lab_outputs = [ui.lab_status, ui.lab_out, ui.lab_summary, ui.lab_matrix]
    for control in ui.lab_controls():  # user input only (a run setting the controls re-judges nothing); a drag's
        # many steps coalesce to the last one
        control.input(on_lab, [ui.last_run, *ui.lab_controls(), ui.lab_disagreements], lab_outputs,
                      api_visibility="private", concurrency_id="engine", trigger_mode="always_last")
    ui.lab_disagreements.input(lambda matrix, only: lab_html(matrix, only) if matrix else gr.update(),
                               [ui.lab_matrix, ui.lab_disagreements], ui.lab_out, api_visibility="private")
    def on_recorded_choice(title):
        return ui.bind(open_recorded(downloads, recorded_runs().get(title), title) if title else {})

    def on_recorded_upload(file):
        return ui.bind(open_recorded(downloads, file))

    ui.recorded_choice.change(on_recorded_choice, ui.recorded_choice, ui.view_components(), api_visibility="private")
    ui.recorded_upload.upload(on_recorded_upload, ui.recorded_upload, ui.view_components(), api_visibility="private")
    gr.api(on_compare, api_name="compare", concurrency_id="engine", time_limit=RUN_TIME_LIMIT_S)


def create_demo(studio: Studio, downloads: Downloads | None = None) -> gr.Blocks:
    """The whole UI over one Studio: layout, then the listeners."""
    downloads = downloads or Downloads()
    with gr.Blocks(title="DropMatch Studio", delete_cache=(3600, 3600)) as demo:
        ui = build_layout()
        register_listeners(demo, ui, studio, downloads)
    demo.queue(default_concurrency_limit=1, max_size=64)
    return demo


def main() -> None:
    parser = argparse.ArgumentParser(description="DropMatch Studio")
    parser.add_argument("--host", default=None, help="default: $GRADIO_SERVER_NAME, else 127.0.0.1")
    parser.add_argument("--port", type=int, default=None, help="default: $GRADIO_SERVER_PORT, else 7860")
    parser.add_argument("--share", action="store_true")
    args = parser.parse_args()
    from dropmatch.engine import Engine
    from dropmatch.models import load_pair
    from dropmatch.studio import Policy

    studio = Studio(load_pair, Engine, Policy.from_env())
    studio.preload(PRESETS[DEFAULT_PRESET])
    downloads = Downloads()
    try:
        # None lets Gradio read GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, as a Space sets them.
        create_demo(studio, downloads).launch(server_name=args.host, server_port=args.port, share=args.share,
                                              css=css())
    finally:
        downloads.close()


if __name__ == "__main__":
    main()
