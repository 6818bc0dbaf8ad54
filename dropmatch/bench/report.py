"""One HTML page from a benchmark JSON document. Plotly.js is written once beside the pages (one file
per plotly.js version, shared by every report in the folder) instead of inlined in each: a report
still opens offline, from its folder."""

from __future__ import annotations

import html
from pathlib import Path
from string import Template

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs, get_plotlyjs_version
from plotly.subplots import make_subplots

from ..assets import REPORT_TEMPLATE
from ..decoding.acceptance import BASELINE, METHOD
from ..plots import frontier_figure
from .tables import (CATEGORY_HEADER, HEADER, SAME_DRAFTS_HEADER, band_text, category_rows,
                     gain_text, same_drafts_caption, same_drafts_rows, signed, signed_points, summary_rows,
                     vs_ar_caption)

TRAJECTORIES = ("Each rule's own text: every rule decodes each prompt; after its first lossy token it writes another "
                "text with other drafts, so its tau and speed measure the rule and the text it led to.")

PAPER = ("Paper (arXiv 2603.03333, 8B-70B targets): speedup 1.09-1.33x over standard SD, about +10% mean "
         "acceptance length, accuracy within about 1 point on GSM8K / MMLU / IFEval / HumanEval; the MC head "
         "costs 1.64% of a step on Llama-3.1-70B.")


def _bars(document: dict, key: str, title: str, ytitle: str, percent: bool = False) -> go.Figure:
    fig = go.Figure()
    benchmarks = list(document["benchmarks"])
    for label in sorted({label for b in document["benchmarks"].values() for label in b["rules"]},
                        key=lambda label: (label != BASELINE, "@" in label, label)):
        values = [document["benchmarks"][b]["rules"].get(label, {}).get(key) for b in benchmarks]
        shown = [None if v is None else (100 * v if percent else v) for v in values]
        fig.add_trace(go.Bar(name=label, x=benchmarks, y=shown,
                             text=[("" if v is None else (f"{v:.1f}%" if percent else f"{v:.2f}")) for v in shown],
                             textposition="outside"))
    fig.update_layout(title=title, barmode="group", yaxis_title=ytitle, template="plotly_white", height=420,
                      font=dict(size=14), legend=dict(orientation="h", y=-0.2))
    return fig


def _sweep(document: dict) -> go.Figure | None:
    benchmarks = [b for b, s in document["benchmarks"].items() if any(label.startswith("dropmatch@p=") for label in s["rules"])]
    if not benchmarks:
        return None
    fig = make_subplots(rows=1, cols=3, subplot_titles=("tau", "accuracy (where scored)", "target NLL of answers"))
    for name in benchmarks:
        rules = document["benchmarks"][name]["rules"]
        points = sorted((float(label.split("=")[1]), s) for label, s in rules.items() if label.startswith("dropmatch@p="))
        lines = [(points, dict(mode="lines+markers", name=name, legendgroup=name))]
        if (auto := rules.get(METHOD)) and auto.get("p") is not None:  # p = auto's own point, a star
            lines.append(([(auto["p"], auto)], dict(mode="markers", name=f"{name}: p=auto", legendgroup=name + "auto",
                                                    marker=dict(symbol="star", size=16))))
        for shown, style in lines:
            for col, key in ((1, "tau"), (2, "accuracy"), (3, "target_nll")):
                fig.add_trace(go.Scatter(x=[p for p, _ in shown], y=[s.get(key) for _, s in shown], showlegend=col == 1,
                                         **style), row=1, col=col)
    fig.update_xaxes(title="dropout rate p")
    fig.update_layout(title="Sweep over p: the speed / quality trade-off (p = 0 is lossless greedy)",
                      template="plotly_white", height=440, font=dict(size=14), legend=dict(orientation="h", y=-0.25))
    return fig


def _positions(document: dict) -> go.Figure:
    fig = go.Figure()
    for name, summary in document["benchmarks"].items():
        for label in (BASELINE, METHOD):
            if curve := summary["rules"].get(label, {}).get("per_position_acceptance"):
                fig.add_trace(go.Scatter(x=list(range(1, len(curve) + 1)), y=curve, mode="lines+markers",
                                         name=f"{name}: {label}"))
    fig.update_layout(title="Acceptance by draft position (accepted / reached)", xaxis_title="draft slot",
                      yaxis_title="acceptance", template="plotly_white", height=400, font=dict(size=14),
                      yaxis_range=[0, 1])
    return fig


def _html_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + f"</tr>{cells}</table>"


def same_drafts_section(document: dict) -> str:
    """The comparison on the same drafts, one table per draft policy (empty where it did not run)."""
    parts = [f"<p>{html.escape(same_drafts_caption(document, policy))}</p>"
             + _html_table(SAME_DRAFTS_HEADER, same_drafts_rows(document, policy))
             for policy in document.get("same_drafts", {})]
    return "<h2>On lossless SD's drafts</h2>" + "".join(parts) if parts else ""


def _table(document: dict) -> str:
    """The trajectory results (each rule's own text): one table of every benchmark's runs, then the
    per-category tables; empty where no trajectory ran."""
    if not document["benchmarks"]:
        return ""
    rows = [(summary.get("label", name), *row) for name, summary in document["benchmarks"].items()
            for row in summary_rows(summary)]
    tables = [_html_table(("benchmark", *HEADER), rows)]
    for name, summary in document["benchmarks"].items():
        if rows := category_rows(summary):
            tables.append(f"<h3>{html.escape(summary.get('label', name))} by category</h3>"
                          + _html_table(CATEGORY_HEADER, rows))
    caption = f"{TRAJECTORIES} {vs_ar_caption(*document['benchmarks'].values())}."
    return f"<h2>Each rule's own text</h2><p>{html.escape(caption)}</p>" + "\n".join(tables)


def verdicts(document: dict) -> list[str]:
    """Plain sentences per benchmark: DropMatch's tau gain over lossless SD (the +10% bar), its speed
    vs lossless, and whether it stays within the target's own variation (target NLL at or below the
    reference samples', off-nucleus rate at most 1%); accuracy where scored."""
    lines = []
    for name, summary in document["benchmarks"].items():
        lossless, lossy = summary["rules"].get(BASELINE), summary["rules"].get(METHOD)
        if not lossless or not lossy or not lossless["tau"]:
            continue
        gain = lossy["tau"] / lossless["tau"] - 1
        early = lossy.get("ended_early_prompts")
        bar = f"no win: it ended {early} answer{'s' if early > 1 else ''} early" if early else \
            f"{'meets' if gain >= 0.10 else 'misses'} the +10% bar"
        parts = [f"tau {100 * gain:+.0f}% ({bar})"]
        if lossy.get("speedup_vs_lossless") is not None:
            parts.append(f"{lossy['speedup_vs_lossless']:.2f}x lossless speed")
        reference = summary.get("reference", {}).get("target_sampled")
        if reference and lossy.get("target_nll") is not None:
            repetition = ""
            if (yardstick := lossy.get("repetition_yardstick")) is not None and lossy.get("distinct2") is not None:
                repetition = f", distinct-2 {lossy['distinct2']:.3f} vs lossless SD's greedy text's {yardstick:.3f}"
            elif reference.get("distinct2") is not None and lossy.get("distinct2") is not None:
                repetition = f", distinct-2 {lossy['distinct2']:.3f} vs the samples' {reference['distinct2']:.3f}"
            parts.append(f"target NLL {lossy['target_nll']:.3f} vs the target's own samples {reference['target_nll']:.3f}, "
                         f"off-nucleus {100 * (lossy.get('off_nucleus_rate') or 0):.1f}%{repetition}: "
                         + band_text(lossy.get("band")).replace("within", "stays within the target's own variation"))
        elif lossy.get("target_nll") is not None:
            parts.append(f"target NLL {lossy['target_nll']:.3f} (lossless {lossless.get('target_nll') or 0:.3f}; "
                         "no reference samples to judge it by)")
        if lossy.get("delta_target_nll") is not None:
            parts.append(f"against lossless SD on the same prompts: NLL {signed(lossy['delta_target_nll'])}, off-nucleus "
                         f"{signed_points(lossy.get('delta_off_nucleus_rate'))}, distinct-2 "
                         f"{signed(lossy.get('delta_distinct2'))}")
        if summary.get("task_score_note"):
            parts.append(f"no task score ({summary['task_score_note']})")
        elif lossless.get("accuracy") is not None and lossy.get("accuracy") is not None:
            parts.append(f"accuracy {-100 * (lossless['accuracy'] - lossy['accuracy']):+.1f} points")
        p = "p = auto" if document.get("settings", {}).get("p") in (None, "auto") else f"p = {document['settings']['p']}"
        lines.append(f"{summary.get('label', name)}, DropMatch {p} vs lossless: " + "; ".join(parts) + ".")
    return lines + [line for name, summary in document["benchmarks"].items() if (line := early_ends(name, summary))]


def early_ends(name: str, summary: dict) -> str:
    """The rules that ended answers (an end of text) before lossless SD's on a benchmark, with how many: a
    shorter answer's fewer calls are no win ("" where none did)."""
    ended = [f"{label} {s['ended_early_prompts']} ({100 * s['ended_early']:.0f}%)"
             for label, s in summary["rules"].items() if s.get("ended_early_prompts")]
    if not ended:
        return ""
    return (f"{summary.get('label', name)}: answers ended before lossless SD's (prompts, share): {', '.join(ended)}; "
            "their fewer calls per token are no win.")


REVERSED = {"leads": "trails", "trails": "leads", "ties": "ties"}


def same_drafts_verdicts(document: dict) -> list[str]:
    """Per draft policy and prompt set, a sentence on the method on the same drafts: its tau gain over lossless
    SD with its interval, and the rules it leads, ties and trails (said only beyond the intervals)."""
    lines = []
    for policy, sets in document.get("same_drafts", {}).items():
        shown = document.get("same_drafts_info", {}).get("policies", {}).get(policy, policy)
        for name, rules in sets.items():
            method = rules.get(METHOD)
            if method is None:
                continue
            label = document.get("same_drafts_info", {}).get("sets", {}).get(name, {}).get("label", name)
            by_standing = {"leads": [], "ties": [], "trails": []}
            for rule, figures in rules.items():
                if rule not in (METHOD, BASELINE) and figures.get("against_method"):
                    by_standing[REVERSED[figures["against_method"]["standing"]]].append(rule)
            others = "; ".join(f"{word} {', '.join(names)}" for word, names in by_standing.items() if names)
            lines.append(f"{label}, on lossless SD's drafts ({shown}): {METHOD} {gain_text(method['gain'])} against "
                         f"lossless SD" + (f"; against the other rules it {others}" if others else "") + ".")
    return lines


def step_costs(document: dict) -> list[str]:
    """Per benchmark: lossless SD's draft step against its verification round (both from the JSON),
    the ratio that decides how long a draft pays off on this machine."""
    lines = []
    for name, summary in document["benchmarks"].items():
        lossless = summary["rules"].get(BASELINE) or {}
        draft_ms, round_ms = lossless.get("draft_step_ms"), lossless.get("verify_round_ms")
        if draft_ms and round_ms:
            lines.append(f"{name}: a draft step {draft_ms:.1f} ms, a lossless round {round_ms:.1f} ms "
                         f"(the draft step is 1/{round_ms / draft_ms:.1f} of a round)")
    return lines


def best_points(points: list[dict]) -> dict[str, dict]:
    """Per rule (and centroid), the frontier point with the largest tau gain that stays within the
    reference band, or None when none does."""
    best: dict[str, dict] = {}
    for point in points:
        key = point["rule"] if point["centroid"] == "probs" else f"{point['rule']}/{point['centroid']}"
        best.setdefault(key, None)
        if point.get("within_reference") and (best[key] is None or (point["tau_gain"] or 0) > (best[key]["tau_gain"] or 0)):
            best[key] = point
    return best


def frontier_section(document: dict) -> tuple[list[go.Figure], str]:
    """The frontier figures (overall, then per benchmark) and a table of each rule's best point."""
    points = document.get("frontier") or []
    if not points:
        return [], ""
    figures = []
    for name in dict.fromkeys(p["benchmark"] for p in points):
        summary = document["rules"] if name == "all" else document["benchmarks"][name]["rules"]
        reference = (document.get("reference") if name == "all" else document["benchmarks"][name].get("reference")) or {}
        figures.append(frontier_figure([p for p in points if p["benchmark"] == name], summary.get(BASELINE),
                                       reference.get("target_sampled"), title=f"Trade-off frontier: {name}"))
    rows = []
    for key, point in best_points([p for p in points if p["benchmark"] == "all"]).items():
        if point is None:
            rows.append(f"<tr><td>{html.escape(key)}</td><td colspan=5>no point within the target's own variation</td></tr>")
        else:
            rows.append(f"<tr><td>{html.escape(key)}</td><td>{html.escape(point['knob'])} = {point['value']:g}</td>"
                        f"<td>{100 * point['tau_gain']:+.1f}%</td><td>{(point['speed_vs_lossless'] or 0):.2f}x</td>"
                        f"<td>{point['target_nll']:.3f}</td><td>{100 * point['off_nucleus_rate']:.1f}%</td></tr>")
    table = ("<h2>Best point of each rule within the target's own variation (all prompts)</h2><table><tr><th>rule</th>"
             "<th>setting</th><th>tau gain</th><th>speed vs lossless</th><th>target NLL</th><th>off-nucleus</th></tr>"
             + "".join(rows) + "</table>")
    return figures, table


def plotlyjs_name() -> str:
    return f"plotly-{get_plotlyjs_version()}.min.js"


def write_plotlyjs(folder: Path) -> str:
    """The shared plotly.js beside the reports in `folder` (written when missing); its file name."""
    name = plotlyjs_name()
    target = folder / name
    if not target.exists():
        target.write_text(get_plotlyjs(), encoding="utf-8")
    return name


def _bullets(lines: list[str]) -> str:
    return "".join(f"<li>{html.escape(line)}</li>" for line in lines)


def write_report(document: dict, path: Path) -> None:
    """The report page (assets/report.html filled in), with the shared plotly.js beside it."""
    figures = [
        _bars(document, "tau", "Mean acceptance length tau (tokens per target call)", "tau"),
        _bars(document, "acceptance_rate", "Acceptance rate of drafted tokens", "%", percent=True),
        _bars(document, "speedup_vs_ar", "Speedup over the target alone (tokens/s ratio; "
              f"{vs_ar_caption(*document['benchmarks'].values())})", "x"),
        _bars(document, "speedup_vs_lossless", "Speed relative to lossless SD", "x"),
        _bars(document, "mc_overhead", "MC-head share of a verification round", "%", percent=True),
        _bars(document, "accuracy", "Accuracy (GSM8K exact match, HumanEval pass@1, IFEval instructions followed)", "score"),
        _sweep(document),
        _positions(document),
    ] if document["benchmarks"] else []
    frontier_figures, frontier_table = frontier_section(document)
    figures = frontier_figures + figures
    parts = [fig.to_html(full_html=False, include_plotlyjs=False) for fig in figures if fig is not None]
    settings = document["settings"]
    fields = {key: html.escape(str(settings.get(key, "" if key in ("date", "machine") else None)))
              for key in ("date", "machine", "target", "draft", "gamma", "k", "p", "temperature", "max_new_tokens")}
    page = Template(REPORT_TEMPLATE.read_text(encoding="utf-8")).substitute(
        fields, script=write_plotlyjs(path.parent), command=html.escape(str(settings.get("command") or "")),
        interrupted=" · <b>interrupted: partial results</b>" if document.get("interrupted") else "",
        paper=html.escape(PAPER), verdicts=_bullets(same_drafts_verdicts(document) + verdicts(document)),
        step_costs=_bullets(step_costs(document)), same_drafts=same_drafts_section(document), table=_table(document),
        frontier_table=frontier_table, figures="".join(parts))
    path.write_text(page, encoding="utf-8")


def _markdown(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["|" + "|".join(f" {c} " if c else " " for c in row) + "|" for row in rows]]


def markdown_table(document: dict) -> str:
    """The README's results: the comparison on the same drafts (one table per draft policy) where it ran, then
    each rule's own text (one row per benchmark and run), with the command they came from."""
    settings = document["settings"]
    lines = [f"Measured {settings.get('date', '')} on {settings.get('machine', '')} with:", "",
             f"```bash\n{settings.get('command', '')}\n```"]
    for policy in document.get("same_drafts", {}):
        lines += ["", f"**{same_drafts_caption(document, policy)}**", "",
                  *_markdown(SAME_DRAFTS_HEADER, same_drafts_rows(document, policy))]
    if document["benchmarks"]:
        rows = [(summary.get("label", name) if i == 0 else "", *row[:-1])  # no overlap column
                for name, summary in document["benchmarks"].items() for i, row in enumerate(summary_rows(summary))]
        lines += ["", f"**{TRAJECTORIES} {vs_ar_caption(*document['benchmarks'].values())}.**", "",
                  *_markdown(("benchmark", *HEADER[:-1]), rows)]
    for name, summary in document["benchmarks"].items():
        if rows := category_rows(summary):
            lines += ["", f"{summary.get('label', name)} by category:", "", *_markdown(CATEGORY_HEADER, rows)]
    sentences = same_drafts_verdicts(document) + verdicts(document) + step_costs(document)
    lines += ["", *[f"- {v}" for v in sentences], "", PAPER]
    return "\n".join(lines)
