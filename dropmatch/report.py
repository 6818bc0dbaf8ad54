"""One self-contained HTML page (Plotly inlined) from a benchmark JSON document."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .tables import CATEGORY_HEADER, category_rows, summary_rows

PAPER = ("Paper (arXiv 2603.03333, 8B-70B targets): speedup 1.09-1.33x over standard SD, about +10% mean "
         "acceptance length, accuracy within about 1 point on GSM8K / MMLU / IFEval / HumanEval; the MC head "
         "costs 1.64% of a step on Llama-3.1-70B.")


def _bars(document: dict, key: str, title: str, ytitle: str, percent: bool = False) -> go.Figure:
    fig = go.Figure()
    benchmarks = list(document["benchmarks"])
    labels = sorted({label for b in document["benchmarks"].values() for label in b["rules"]},
                    key=lambda label: (label != "lossless", "@" in label, label))
    for label in labels:
        values = [document["benchmarks"][b]["rules"].get(label, {}).get(key) for b in benchmarks]
        shown = [None if v is None else (100 * v if percent else v) for v in values]
        fig.add_trace(go.Bar(name=label, x=benchmarks, y=shown,
                             text=[("" if v is None else (f"{v:.1f}%" if percent else f"{v:.2f}")) for v in shown],
                             textposition="outside"))
    fig.update_layout(title=title, barmode="group", yaxis_title=ytitle, template="plotly_white", height=420,
                      font=dict(size=14), legend=dict(orientation="h", y=-0.2))
    return fig


def _sweep(document: dict) -> go.Figure | None:
    benchmarks = [b for b, s in document["benchmarks"].items() if any("@" in label for label in s["rules"])]
    if not benchmarks:
        return None
    fig = make_subplots(rows=1, cols=3, subplot_titles=("tau", "accuracy (where scored)", "target NLL of answers"))
    for name in benchmarks:
        rules = document["benchmarks"][name]["rules"]
        points = sorted((float(label.split("=")[1]), s) for label, s in rules.items() if "@" in label)
        xs = [p for p, _ in points]
        for col, key in ((1, "tau"), (2, "accuracy"), (3, "target_nll")):
            fig.add_trace(go.Scatter(x=xs, y=[s.get(key) for _, s in points], mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=col == 1), row=1, col=col)
        auto = rules.get("dropmatch")
        if auto and auto.get("p") is not None:
            for col, key in ((1, "tau"), (2, "accuracy"), (3, "target_nll")):
                fig.add_trace(go.Scatter(x=[auto["p"]], y=[auto.get(key)], mode="markers", name=f"{name}: p=auto",
                                         marker=dict(symbol="star", size=16), legendgroup=name + "auto",
                                         showlegend=col == 1), row=1, col=col)
    fig.update_xaxes(title="dropout rate p")
    fig.update_layout(title="Sweep over p: the speed / quality trade-off (p = 0 is lossless greedy)",
                      template="plotly_white", height=440, font=dict(size=14), legend=dict(orientation="h", y=-0.25))
    return fig


def _positions(document: dict) -> go.Figure:
    fig = go.Figure()
    for name, summary in document["benchmarks"].items():
        for label in ("lossless", "dropmatch"):
            curve = summary["rules"].get(label, {}).get("per_position_acceptance")
            if curve:
                fig.add_trace(go.Scatter(x=list(range(1, len(curve) + 1)), y=curve, mode="lines+markers",
                                         name=f"{name}: {label}"))
    fig.update_layout(title="Acceptance by draft position (accepted / reached)", xaxis_title="draft slot",
                      yaxis_title="acceptance", template="plotly_white", height=400, font=dict(size=14),
                      yaxis_range=[0, 1])
    return fig


def _table(document: dict) -> str:
    head = ("benchmark", "run", "tau", "accept", "tok/s", "vs AR", "vs lossless", "MC share", "p", "accuracy",
            "target NLL", "distinct-2", "overlap w/ lossless")
    rows = [(name, *row) for name, summary in document["benchmarks"].items() for row in summary_rows(summary)]
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    header = "".join(f"<th>{h}</th>" for h in head)
    tables = [f"<table><tr>{header}</tr>{cells}</table>"]
    for name, summary in document["benchmarks"].items():
        rows = category_rows(summary)
        if rows:
            cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
            header = "".join(f"<th>{h}</th>" for h in CATEGORY_HEADER)
            tables.append(f"<h3>{html.escape(name)} by category</h3><table><tr>{header}</tr>{cells}</table>")
    return "\n".join(tables)


def verdicts(document: dict) -> list[str]:
    """Plain sentences: does DropMatch (as run) meet +10% tau, <= 2 points accuracy, <= +10% target NLL?"""
    lines = []
    for name, summary in document["benchmarks"].items():
        lossless, lossy = summary["rules"].get("lossless"), summary["rules"].get("dropmatch")
        if not lossless or not lossy or not lossless["tau"] or not lossless["target_nll"]:
            continue
        gain = lossy["tau"] / lossless["tau"] - 1
        rise = lossy["target_nll"] / lossless["target_nll"] - 1
        parts = [f"tau {100 * gain:+.0f}% ({'meets' if gain >= 0.10 else 'misses'} the +10% bar)"]
        if lossless.get("accuracy") is not None and lossy.get("accuracy") is not None:
            drop = 100 * (lossless["accuracy"] - lossy["accuracy"])
            parts.append(f"accuracy {-drop:+.1f} points ({'within' if drop <= 2 + 1e-9 else 'NOT within'} 2 points)")
        parts.append(f"target NLL {100 * rise:+.0f}% ({'within' if rise <= 0.10 else 'does NOT hold:'} the +10% bar)")
        lines.append(f"{name} ({summary['prompts']} prompts), DropMatch p = auto vs lossless: " + "; ".join(parts) + ".")
    return lines


def write_report(document: dict, path: Path) -> None:
    figures = [
        _bars(document, "tau", "Mean acceptance length tau (tokens per target call)", "tau"),
        _bars(document, "acceptance_rate", "Acceptance rate of drafted tokens", "%", percent=True),
        _bars(document, "speedup_vs_ar", "Speedup over autoregressive decoding (tokens/s ratio)", "x"),
        _bars(document, "speedup_vs_lossless", "Speed relative to lossless SD", "x"),
        _bars(document, "mc_overhead", "MC-head share of a verification round", "%", percent=True),
        _bars(document, "accuracy", "Accuracy (GSM8K exact match, HumanEval pass@1, IFEval instructions followed)", "score"),
        _sweep(document),
        _positions(document),
    ]
    parts = []
    for i, fig in enumerate(f for f in figures if f is not None):
        parts.append(fig.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False))
    settings = document["settings"]
    command = html.escape(" ".join(str(settings.get(k)) for k in ("command",) if settings.get("command")))
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>DropMatch benchmark report</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;max-width:1400px}} table{{border-collapse:collapse;font-size:14px}}
td,th{{border:1px solid #cfd8dc;padding:4px 8px;text-align:right}} td:nth-child(-n+2){{text-align:left}}</style></head><body>
<h1>DropMatch benchmark report</h1>
<p>{html.escape(settings.get('date', ''))} · {html.escape(settings.get('machine', ''))} · pair: target
{html.escape(str(settings.get('target')))}, draft {html.escape(str(settings.get('draft')))} · gamma {settings.get('gamma')},
K {settings.get('k')}, p {settings.get('p')}, temperature {settings.get('temperature')}, max new tokens
{settings.get('max_new_tokens')}{' · <b>interrupted: partial results</b>' if document.get('interrupted') else ''}</p>
<p><code>{command}</code></p>
<p>{html.escape(PAPER)}</p>
<h2>Verdict</h2><ul>{''.join(f"<li>{html.escape(v)}</li>" for v in verdicts(document))}</ul>
<p>tau = tokens emitted / verification rounds (bonus and correction included). MC share = MC work (masks, the
path logits, path softmaxes, JS, votes) / round time. Target NLL = mean negative
log-likelihood (nats/token) of the answer under the clean target. MT-Bench has no judge offline: its quality
columns are the NLL, distinct-2 and token overlap with the lossless answer, not a judged score.</p>
{_table(document)}
{''.join(parts)}
</body></html>"""
    path.write_text(page, encoding="utf-8")


def markdown_table(document: dict) -> str:
    """The README's results table: one row per benchmark and run, with the settings it came from."""
    settings = document["settings"]
    lines = [
        f"Measured {settings.get('date', '')} on {settings.get('machine', '')} with:",
        "",
        f"```bash\n{settings.get('command', '')}\n```",
        "",
        "| benchmark | run | tau | acceptance | tokens/s | vs AR | vs lossless | MC share | p | accuracy | target NLL | distinct-2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, summary in document["benchmarks"].items():
        for i, row in enumerate(summary_rows(summary)):
            first = f"{name} ({summary['prompts']})" if i == 0 else ""
            cells = (first, *row[:-1])  # no overlap column
            lines.append("|" + "|".join(f" {c} " if c else " " for c in cells) + "|")
    for name, summary in document["benchmarks"].items():
        rows = category_rows(summary)
        if rows:
            lines += ["", f"{name} by category:", "", "| " + " | ".join(CATEGORY_HEADER) + " |",
                      "|" + "---|" * len(CATEGORY_HEADER)]
            lines += ["|" + "|".join(f" {c} " if c else " " for c in row) + "|" for row in rows]
    lines += ["", *[f"- {v}" for v in verdicts(document)], "", PAPER]
    return "\n".join(lines)
