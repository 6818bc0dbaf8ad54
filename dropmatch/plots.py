"""Plotly figures built from traces only (no model, no UI). Sized for a projector.

token_text: a function from token id to its text, so that hover labels read as words.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .decoding.acceptance import BASELINE, KNOBS, REASONS, RULES, votes_needed
from .intervals import trajectory_gains
from .metrics import MAX_OFF_NUCLEUS
from .render import TokenText
from .rule_words import REASON_WORDS, RULE_WORDS
from .decoding.trace import DraftedToken, GenerationTrace, RoundTrace

RUN_COLORS = {"lossless": "#455a64", "lossy": "#1565c0", "autoregressive": "#9e9e9e"}
# The run's own point in Trade-offs: a yellow star outlined in black, a colour no rule wears (test_app checks).
RUN_STAR = dict(symbol="star", size=18, color="#ffd600", line=dict(width=1.5, color="#212121"))
FONT = dict(size=16)
MAX_HEATMAP_COLUMNS = 60


WRAP_AT = 30  # characters a title line may hold: Plotly never wraps, and a phone's plot is ~350 px wide
WRAP_Y_AT = 22  # a y axis's title line, upright along one panel (a phone's panel may be only ~220 px tall)


def knob_short(name: str) -> str:
    """A swept knob as a reader names it (the legend says what was swept, not a field name)."""
    knob = KNOBS.get(name)
    return (knob.short or knob.label) if knob else name


def wrapped(text: str, width: int = WRAP_AT) -> str:
    """text with <br> between words so that no line is longer than width (a longer word stays whole)."""
    lines, line = [], ""
    for word in str(text).split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "<br>".join([*lines, line])


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    """The shared look, readable from a phone (about 330 px) to a projector: every title and axis title
    wrapped (WRAP_AT); the title, the axes' labels and the legend each get their own room (Plotly's
    automargin; the legend sits under the plot, in the figure's bottom margin, however many rows it
    wraps into); an x axis's labels turn upright only when they do not fit side by side."""
    fig.update_layout(
        title=dict(text=wrapped(title), font=dict(size=18), automargin=True, yref="paper", pad=dict(b=12)),
        font=FONT, template="plotly_white", height=height, margin=dict(l=60, r=24, t=24, b=24),
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
    )
    fig.for_each_xaxis(lambda axis: axis.update(title_text=wrapped(axis.title.text)) if axis.title.text else None)
    fig.for_each_yaxis(lambda axis: axis.update(title_text=wrapped(axis.title.text, WRAP_Y_AT)) if axis.title.text else None)
    fig.update_xaxes(autotickangles=[0, -90])
    return fig


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=wrapped(message), showarrow=False, font=dict(size=18), x=0.5, y=0.5, xref="paper",
                       yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height=300)


def drafted_positions(rounds: tuple[RoundTrace, ...] | list[RoundTrace]) -> list[tuple[int, int, DraftedToken]]:
    """(round, position in round, record) of every drafted token, in order."""
    return [(r.index, j, d) for r in rounds for j, d in enumerate(r.drafted)]


def show(text: str) -> str:
    """Token text made visible in a label: spaces and newlines shown."""
    return text.replace(" ", "␣").replace("\n", "⏎") or "∅"


def agreement_heatmap(trace: GenerationTrace, token_text: TokenText) -> go.Figure:
    """Rows: K paths, the paths' majority, the draft; columns: the drafted positions whose paths were
    run (those the rule judged: never the clean target's choice, so a clean-target row would be
    grey throughout); cell: does this row's token equal the drafted token. The majority row is green
    where the paths' top token is the draft with the votes the majority rule asks."""
    title = "MC-path agreement with the draft token"
    cells = [(r, j, d) for r, j, d in drafted_positions(trace.rounds) if d.path_tokens][:MAX_HEATMAP_COLUMNS]
    if not cells:
        return _empty(title, f"the {trace.label} rule reads no Monte-Carlo paths")
    num_paths = len(cells[0][2].path_tokens)
    needed = votes_needed(num_paths, trace.rule_config.majority_fraction)
    rows = [f"path {k + 1}" for k in range(num_paths)] + ["paths' majority", "draft"]
    drafts = [d for _, _, d in cells]
    z = [[int(d.path_tokens[k] == d.token) for d in drafts] for k in range(num_paths)]
    z += [[int(d.majority_token == d.token and (d.draft_votes or 0) >= needed) for d in drafts], [1] * len(drafts)]
    hover = [[_path_hover(d, k, token_text) for d in drafts] for k in range(num_paths)]
    hover += [[_majority_hover(d, num_paths, needed, token_text) for d in drafts],
              [f"draft: {show(token_text(d.token))} (q={d.draft_prob:.3f})<br>decision: {d.reason}" for d in drafts]]
    labels = [f"r{r}·{j + 1}" for r, j, _ in cells]
    fig = go.Figure(go.Heatmap(
        z=z, x=labels, y=rows, text=hover, hoverinfo="text", zmin=0, zmax=1, xgap=2, ygap=2, showscale=False,
        colorscale=[[0, "#eceff1"], [0.5, "#eceff1"], [0.5, "#43a047"], [1, "#43a047"]],
    ))
    for i, (_, _, d) in enumerate(cells):
        # name "token": the page hides these where a cell is narrower than their line (assets/theme.js)
        fig.add_annotation(x=labels[i], y="draft", text=show(token_text(d.token))[:6], showarrow=False,
                           font=dict(size=11, color="white"), textangle=-90, name="token")
    fig.update_xaxes(title="round · slot", tickfont=dict(size=11))  # short: it sits beside long row names
    return _layout(fig, title + " at each judged position (green: the same token; exact matches need no paths)",
                   height=260 + 28 * len(rows))


def _majority_hover(d: DraftedToken, num_paths: int, needed: int, token_text: TokenText) -> str:
    if d.majority_token is None or d.majority_token < 0:
        top = f"no single top token (a tie at {d.majority_votes} votes)"
    else:
        top = f"top token {show(token_text(d.majority_token))} with {d.majority_votes}/{num_paths} votes"
    return (f"paths' majority: {top}<br>the draft has {d.draft_votes}/{num_paths}; the majority rule asks {needed}"
            f"<br>clean target: {show(token_text(d.target_token))} (p={d.target_token_prob:.3f})")


def _path_hover(d: DraftedToken, k: int, token_text: TokenText) -> str:
    top = d.path_top[k] if d.path_top else ()
    listing = ", ".join(f"{show(token_text(t))} {p:.2f}" for t, p in top)
    return (f"path {k + 1}: {show(token_text(d.path_tokens[k]))}<br>top: {listing}"
            f"<br>draft: {show(token_text(d.token))}")


def js_scatter(trace: GenerationTrace, token_text: TokenText) -> go.Figure:
    """JS(draft || centroid) of each checked drafted token against its threshold (max path JS)."""
    title = "JS divergence vs threshold"
    cells = [(i, r, j, d) for i, (r, j, d) in enumerate(drafted_positions(trace.rounds))
             if d.js is not None and d.reason != "unchecked"]
    if not cells:
        return _empty(title, f"the {trace.label} rule computes no JS against MC paths")
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[i for i, *_ in cells], y=[d.threshold for *_, d in cells], mode="markers", name="threshold (max path JS)",
        marker=dict(symbol="line-ew-open", size=18, line=dict(width=3, color="#37474f")), hoverinfo="skip",
    ))
    for reason in [name for name in REASONS if name != "unchecked"]:
        group = [(i, r, j, d) for i, r, j, d in cells if d.reason == reason]
        if not group:
            continue
        rejected = reason == "rejected"
        fig.add_trace(go.Scatter(
            x=[i for i, *_ in group], y=[d.js for *_, d in group], mode="markers", name=reason,
            marker=dict(color=REASON_WORDS[reason].colour, size=14 if rejected else 10,
                        symbol="x" if rejected else "circle", line=dict(width=1, color="white")),
            text=[f"r{r}·{j + 1} {show(token_text(d.token))}<br>JS={d.js:.4f} threshold={d.threshold:.4f}"
                  f"<br>votes {d.draft_votes}/{len(d.path_tokens)} → {d.reason}" for _, r, j, d in group],
            hoverinfo="text",
        ))
    fig.update_yaxes(title="JS (nats)", type="log", dtick="D2")  # 1, 2, 5 per decade: digits that never crowd
    fig.update_xaxes(title="drafted token (in order)")
    return _layout(fig, title)


def acceptance_lengths(lossless: GenerationTrace, lossy: GenerationTrace) -> go.Figure:
    """Accepted draft tokens per round for both runs, and their histograms."""
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2)  # stacked: each panel the chart's full width
    for trace, key in ((lossless, "lossless"), (lossy, "lossy")):
        accepted = [r.num_accepted for r in trace.rounds]
        fig.add_trace(go.Scatter(x=list(range(1, len(accepted) + 1)), y=accepted, mode="lines+markers",
                                 name=trace.label, line=dict(color=RUN_COLORS[key], width=3),
                                 legendgroup=key), row=1, col=1)
        if trace.gamma_auto:  # the length each round asked for (gamma = auto chose it)
            fig.add_trace(go.Scatter(x=list(range(1, len(accepted) + 1)), y=[r.gamma for r in trace.rounds],
                                     mode="lines", name=f"γ chosen ({trace.label})", legendgroup=key,
                                     line=dict(color=RUN_COLORS[key], width=1, dash="dot", shape="hv")), row=1, col=1)
        fig.add_trace(go.Histogram(x=accepted, name=trace.label, marker_color=RUN_COLORS[key], opacity=0.7,
                                   xbins=dict(start=-0.5, end=max(lossless.gamma, lossy.gamma) + 0.5, size=1),
                                   legendgroup=key, showlegend=False), row=2, col=1)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="round", row=1, col=1)
    fig.update_yaxes(title="accepted per round", row=1, col=1)
    fig.update_xaxes(title="accepted draft tokens in a round", dtick=1, row=2, col=1)
    fig.update_yaxes(title="rounds", row=2, col=1)
    return _layout(fig, "Acceptance length", height=680)


def tokens_vs_calls(lossless: GenerationTrace, lossy: GenerationTrace, ar: GenerationTrace | None = None) -> go.Figure:
    """Tokens emitted against target calls: the steeper, the fewer expensive target passes."""
    fig = go.Figure()
    traces = [(lossless, "lossless"), (lossy, "lossy")] + ([(ar, "autoregressive")] if ar is not None else [])
    for trace, key in traces:
        calls, tokens = [1], [1]  # the prefill call emits the first token
        for r in trace.rounds:
            calls.append(calls[-1] + 1)
            tokens.append(tokens[-1] + len(r.emitted))
        fig.add_trace(go.Scatter(x=calls, y=tokens, mode="lines+markers", name=trace.label,
                                 line=dict(color=RUN_COLORS[key], width=3, dash="dot" if key == "autoregressive" else None)))
    fig.update_xaxes(title="target calls (prefill + verification rounds)")
    fig.update_yaxes(title="tokens emitted")
    return _layout(fig, "Tokens emitted vs target calls")


def all_figures(lossless: GenerationTrace, lossy: GenerationTrace, ar: GenerationTrace | None,
                token_text: TokenText) -> dict[str, go.Figure]:
    return {
        "agreement": agreement_heatmap(lossy, token_text),
        "js": js_scatter(lossy, token_text),
        "acceptance": acceptance_lengths(lossless, lossy),
        "tokens_vs_calls": tokens_vs_calls(lossless, lossy, ar),
    }


def frontier_figure(points: list[dict], lossless: dict | None, reference: dict | None,
                    current: dict | None = None, title: str = "Trade-off frontier") -> go.Figure:
    """Each lossy rule swept over its knob (bench --frontier points): tau gain over lossless SD against
    the quality the target sees, target NLL (left) and off-nucleus rate (right). Shaded: the reference
    band, where the target's own samples (T 0.7, top-p 0.95) lie. lossless: its {"target_nll",
    "off_nucleus_rate"} (the origin of the y axis); current: one run's point {"tau_gain", "target_nll",
    "off_nucleus_rate", "label"} drawn as a star."""
    if not points:
        return _empty(title, "no frontier points: run the benchmark with --frontier")
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2)  # stacked: each panel the chart's full width
    groups: dict[str, list[dict]] = {}
    for point in points:
        label = run_label(point["rule"])
        reads = point["rule"] in RULES and any(k.name == "centroid" for k in RULES[point["rule"]].knobs)
        name = label if point["centroid"] == KNOBS["centroid"].default or not reads \
            else f"{label}, {point['centroid']} centroid"
        groups.setdefault(wrapped(f"{name}: {knob_short(point['knob'])} swept", 24), []).append(point)
    for name, group in groups.items():
        colour = RULE_WORDS[group[0]["rule"]].colour if group[0]["rule"] in RULES else None
        dash = "dot" if "logits centroid" in name else None
        hover = [f"{p['label']}<br>tau gain {100 * (p['tau_gain'] or 0):+.1f}%<br>NLL {p['target_nll']:.3f}, "
                 f"off-nucleus {100 * (p['off_nucleus_rate'] or 0):.1f}%<br>speed vs lossless "
                 f"{p['speed_vs_lossless'] or 0:.2f}x" + (f"<br>run of {p['run'][:10]}" if p.get("run") else "")
                 for p in group]
        for row, key, scale in ((1, "target_nll", 1.0), (2, "off_nucleus_rate", 100.0)):
            fig.add_trace(go.Scatter(
                x=[scale * (p[key] or 0.0) for p in group], y=[100 * (p["tau_gain"] or 0.0) for p in group],
                mode="lines+markers", name=name, legendgroup=name, showlegend=row == 1, text=hover,
                hoverinfo="text", line=dict(color=colour, dash=dash)), row=row, col=1)
    marks = [] if not lossless else [(lossless, 0.0, "lossless SD", "lossless",
                                      dict(symbol="square", size=12, color="#455a64"))]
    if current and current.get("tau_gain") is not None and current.get("target_nll") is not None:
        marks.append((current, 100 * current["tau_gain"], current.get("label", "this run"), "current", RUN_STAR))
    for point, y, name, group, marker in marks:  # single points: lossless SD at the origin, this run as a star
        for row, x in ((1, point.get("target_nll") or 0.0), (2, 100 * (point.get("off_nucleus_rate") or 0.0))):
            fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name=name, legendgroup=group, showlegend=row == 1,
                                     marker=marker), row=row, col=1)
    if reference and reference.get("target_nll") is not None:  # after the traces: empty subplots get no shapes
        for row, x1 in ((1, reference["target_nll"]), (2, 100 * MAX_OFF_NUCLEUS)):
            fig.add_vrect(x0=0, x1=x1, fillcolor="#a5d6a7", opacity=0.3, line_width=0, layer="below", row=row, col=1)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=wrapped("shaded: within the target's own variation", 24),
                                 marker=dict(symbol="square", size=14, color="#a5d6a7")), row=1, col=1)  # the band's key
    fig.update_xaxes(title="target NLL (nats/token)", row=1, col=1)
    fig.update_xaxes(title="off the target's top-p 0.95 nucleus (%)", row=2, col=1)
    fig.update_yaxes(title="tau gain over lossless SD (%)")
    return _layout(fig, title, height=820)


IN_DISTRIBUTION_KINDS = ("gsm8k",)  # the trained judge learned on GSM8K *train*; everything else is out
BAND_AXES = ("nll", "off_nucleus", "repetition")


def run_label(run: str) -> str:
    """A benchmark run's key as a reader names it: "dropmatch@p=0.3" -> "DropMatch (JS, then majority), p = 0.3"."""
    rule, _, setting = run.partition("@")
    label = RULES[rule].label if rule in RULES else f"{rule} (a rule this version no longer has)"
    return f"{label}, {setting.replace('=', ' = ')}" if setting else label


def robustness_rows(document: dict | None) -> list[dict]:
    """Per benchmark and lossy run of a benchmark document (bench --json): tau gain and speed against
    lossless SD (with their 95% intervals over prompts where the rows keep per-prompt counts, else None),
    the quality deltas, the band and the task score, with in/out of the judge's training distribution.
    [] without a document or without lossless runs to compare with."""
    rows = []
    seed = ((document or {}).get("settings") or {}).get("seed") or 0
    for name, benchmark in ((document or {}).get("benchmarks") or {}).items():
        runs = benchmark.get("rules") or {}
        lossless = runs.get(BASELINE)
        if not lossless or not lossless.get("tau"):
            continue
        place = "in" if benchmark.get("kind") in IN_DISTRIBUTION_KINDS else "out"
        intervals = trajectory_gains(((document or {}).get("prompts") or {}).get(name) or [], BASELINE, seed)
        for label, run in runs.items():
            if label == BASELINE:
                continue
            rows.append({"benchmark": name, "place": place, "run": label, "rule": label.split("@")[0],
                         "tau_gain": run["tau"] / lossless["tau"] - 1.0, "speed": run.get("speedup_vs_lossless"),
                         "tau_gain_interval": intervals.get(label, {}).get("tau_gain"),
                         "speed_interval": intervals.get(label, {}).get("speed"),
                         "delta_nll": run.get("delta_target_nll"), "delta_off_nucleus": run.get("delta_off_nucleus_rate"),
                         "delta_distinct2": run.get("delta_distinct2"), "band": run.get("band") or {},
                         "outside": [axis for axis in BAND_AXES if not (run.get("band") or {}).get(axis, False)],
                         "score": run.get("accuracy"), "lossless_score": lossless.get("accuracy")})
    return rows


def robustness_figure(document: dict | None, title: str = "Robustness: in and out of the judge's distribution"
                      ) -> go.Figure:
    """One line per lossy run across the benchmarks (the judge's training distribution first): tau gain
    over lossless SD (left) and the change of the target's NLL (right). A filled marker lies inside the
    reference band on all three axes (NLL, off-nucleus, repetition), an open one outside it."""
    rows = robustness_rows(document)
    if not rows:
        return _empty(title, "no robustness results: run the benchmark with the judge rules (docs/results.md)")
    order = list(dict.fromkeys(r["benchmark"] for r in sorted(rows, key=lambda r: r["place"] != "in")))
    names = {r["benchmark"]: f"{r['benchmark']} ({'in' if r['place'] == 'in' else 'out'})" for r in rows}
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)  # stacked, one benchmarks' axis
    for run in dict.fromkeys(r["run"] for r in rows):
        group = sorted((r for r in rows if r["run"] == run), key=lambda r: order.index(r["benchmark"]))
        colour = RULE_WORDS[group[0]["rule"]].colour if group[0]["rule"] in RULES else None
        inside = [not r["outside"] for r in group]
        hover = [_robustness_hover(r) for r in group]
        for row, values in ((1, [100 * r["tau_gain"] for r in group]), (2, [r["delta_nll"] or 0.0 for r in group])):
            fig.add_trace(go.Scatter(
                x=[names[r["benchmark"]] for r in group], y=values, mode="lines+markers", name=wrapped(run_label(run), 28),
                legendgroup=run, showlegend=row == 1, text=hover, hoverinfo="text",
                line=dict(color=colour, dash="dot" if "@" in run else None),
                marker=dict(size=11, symbol=["circle" if ok else "circle-open" for ok in inside])), row=row, col=1)
    fig.add_hline(y=0.0, line_color="#9e9e9e", line_width=1)
    fig.update_yaxes(title="tau gain over lossless SD (%)", row=1, col=1)
    fig.update_yaxes(title="target NLL change vs lossless (nats/token)", row=2, col=1)
    return _layout(fig, title, height=820)


def _robustness_hover(row: dict) -> str:
    band = ", ".join(f"{axis} {'in' if ok else 'OUT'}" for axis, ok in row["band"].items())
    score = "" if row["score"] is None else f"<br>task score {row['score']:.3f} (lossless {row['lossless_score']:.3f})"
    return (f"{run_label(row['run'])} on {row['benchmark']} ({row['place']} of distribution)<br>tau gain {100 * row['tau_gain']:+.1f}%, "
            f"speed vs lossless {row['speed'] or 0:.2f}x<br>ΔNLL {row['delta_nll'] or 0:+.3f}, Δoff-nucleus "
            f"{100 * (row['delta_off_nucleus'] or 0):+.1f} pt, Δdistinct-2 {row['delta_distinct2'] or 0:+.3f}"
            f"<br>band: {band}{score}")
