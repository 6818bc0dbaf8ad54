"""The rows of a benchmark's results table, shared by the CLI's text table, the HTML report and the
README's Markdown table (pure: summary dicts in, strings out)."""

from __future__ import annotations

from functools import partial

from ..decoding.acceptance import METHOD

GENERATE = "generate"  # the peers' key of the target alone: transformers' generate() (running.active_peers)

HEADER = ("run", "tau", "accept", "tok/s", "vs AR", "vs lossless", "MC share", "p", "accuracy", "NLL", "off-nucleus",
          "dist-2", "Δ NLL", "Δ off-nucleus", "Δ dist-2", "band", "ended early", "overlap w/ lossless")

# What a greedy run's repetition axis is judged against (summary.own_greedy_distinct2); sampled runs: the samples.
GREEDY_YARDSTICK, SAMPLED_YARDSTICK = "the target's greedy text (lossless SD)", "the target's samples"


def percent(value, dash: str = "–") -> str:
    return dash if value is None else f"{100 * value:.1f}%"


def number(value, digits: int = 2, dash: str = "–") -> str:
    return dash if value is None else f"{value:.{digits}f}"


def summary_rows(summary: dict, dash: str = "–", peer: bool = True) -> list[tuple[str, ...]]:
    """One row per run of one benchmark's summary (bench.summarize_benchmark), in HEADER's columns:
    the autoregressive baseline, each rule, then each peer (when there are any and `peer`). "vs AR" is
    against the target alone: transformers' generate() where it ran (its row 1.00x, the engine's own
    autoregressive loop against it), else the engine's loop (1.00x; vs_ar_caption says which)."""
    f = partial(number, dash=dash)

    def score(value) -> str:  # the task score, where lossless SD scores above zero (else why not)
        return f"{dash} ({summary['task_score_note']})" if summary.get("task_score_note") else f(value, 3)

    ar = summary["autoregressive"]
    none = (dash,) * 5  # no deltas, no band, no early ends
    rows = [("autoregressive", "1.00", dash, f(ar["tokens_per_s"], 1), vs_ar(ar), dash, dash, dash,
             score(ar.get("accuracy")), f(ar.get("target_nll"), 3), percent(ar.get("off_nucleus_rate"), dash),
             f(ar.get("distinct2"), 3), *none, dash)]
    if reference := summary.get("reference", {}).get("target_sampled"):
        greedy_yardstick = reference.get("repetition_against") == GREEDY_YARDSTICK
        also = "; repetition judged against lossless SD's greedy text" if greedy_yardstick else ""
        rows.append((f"target sampled (T {reference['temperature']:g}, top-p {reference['top_p']:g}; reference{also})",
                     dash, dash, dash, dash, dash, dash, dash, score(reference.get("accuracy")),
                     f(reference["target_nll"], 3), percent(reference["off_nucleus_rate"], dash),
                     f(reference.get("distinct2"), 3), *none, dash))
    for label, s in summary["rules"].items():
        rows.append((label, f(s["tau"]), f(s["acceptance_rate"]), f(s["tokens_per_s"], 1), f(s["speedup_vs_ar"]) + "x",
                     f(s.get("speedup_vs_lossless")) + "x", percent(s["mc_overhead"], dash), f(s["p"], 3),
                     score(s["accuracy"]), f(s["target_nll"], 3), percent(s.get("off_nucleus_rate"), dash),
                     f(s["distinct2"], 3), signed(s.get("delta_target_nll"), 3, dash),
                     signed_points(s.get("delta_off_nucleus_rate"), dash), signed(s.get("delta_distinct2"), 3, dash),
                     band_text(s.get("band"), dash), percent(s.get("ended_early"), dash),
                     f(s.get("overlap_with_lossless"), 3)))
    for key, shown in (summary.get("peers", {}).items() if peer else ()):
        rows.append((shown["name"], dash, dash, f(shown["tokens_per_s"], 1), "1.00x" if key == GENERATE else dash,
                     f"ours/peer {f(shown['ours_over_peer'])}", dash, dash, dash, dash, dash, dash, *none, dash))
    return rows


def vs_ar(ar: dict) -> str:
    """The autoregressive row's "vs AR": the engine's loop against generate() where it ran, else 1.00x (itself)."""
    return "1.00x" if ar.get("speedup_vs_ar") is None else f"{ar['speedup_vs_ar']:.2f}x"


# What a set's "vs AR" figures are held against: the target alone as a user runs it, or (no --peer) the
# engine's own autoregressive loop, which is no user's baseline (issue 63: it ran at half generate()'s speed).
VS_GENERATE, VS_OWN_LOOP = "transformers' generate() on the same target", "the engine's own autoregressive loop"


def vs_ar_caption(*summaries: dict) -> str:
    """What the sets' "vs AR" column is held against (summarize_benchmark's vs_ar_against; older files: the loop)."""
    against = dict.fromkeys(summary.get("vs_ar_against", VS_OWN_LOOP) for summary in summaries)
    return "vs AR: against " + " / ".join(against) + ("" if VS_GENERATE in against else " (--peer times generate())")


def signed(value, digits: int = 3, dash: str = "–") -> str:
    return dash if value is None else f"{value:+.{digits}f}"


def signed_points(value, dash: str = "–") -> str:
    """A change of a share, in percentage points."""
    return dash if value is None else f"{100 * value:+.1f} pt"


def band_text(checks: dict | None, dash: str = "–") -> str:
    """'within', or which axes of the reference band a run leaves (NLL, off-nucleus, repetition)."""
    if not checks:
        return dash
    failed = [name.replace("_", "-") for name, ok in checks.items() if not ok]
    return "within" if not failed else "outside: " + ", ".join(failed)


CATEGORY_HEADER = ("category", "prompts", "run", "tau", "accept", "tok/s", "vs AR")


def category_rows(summary: dict, dash: str = "–") -> list[tuple[str, ...]]:
    """Rows in CATEGORY_HEADER's columns for a summary with per-category parts (MT-Bench): per
    category, the autoregressive baseline, then each rule; none when the summary has no categories."""
    f = partial(number, dash=dash)
    rows = []
    for category, part in summary.get("categories", {}).items():
        rows.append((category, str(part["prompts"]), "autoregressive", "1.00", dash,
                     f(part["autoregressive"]["tokens_per_s"], 1), vs_ar(part["autoregressive"])))
        rows += [("", "", label, f(s["tau"]), f(s["acceptance_rate"]), f(s["tokens_per_s"], 1),
                  f(s["speedup_vs_ar"]) + "x") for label, s in part["rules"].items()]
    return rows


# ---------------------------------------------------------------- the comparison on the same drafts

SAME_DRAFTS_HEADER = ("prompt set", "rule", "tau", "gain vs lossless SD", "beyond exact", f"gain vs {METHOD}",
                      "target p of lossy tokens", "their rank: median, top-2")


def _bounds(figure: dict, spec: str, scale: float = 1, unit: str = "") -> str:
    """A figure (value, low, high) as "value [low, high]", each scaled and in format `spec`, unit after the value."""
    return f"{scale * figure['value']:{spec}}{unit} [{scale * figure['low']:{spec}}, {scale * figure['high']:{spec}}]"


def interval_text(figure: dict | None, digits: int = 2, dash: str = "–") -> str:
    """A figure with its interval: "2.25 [2.10, 2.40]"."""
    return dash if figure is None else _bounds(figure, f".{digits}f")


def gain_text(figure: dict | None, dash: str = "–") -> str:
    """A gain with its interval and what it supports: "+12.0% [+5.1, +18.3]: leads" (said only beyond the interval)."""
    return dash if figure is None else f"{_bounds(figure, '+.1f', 100, '%')}: {figure['standing']}"


def share_text(figure: dict | None, dash: str = "–") -> str:
    """A share with its interval, in percent: "10.5% [2.6, 17.5]"."""
    return dash if figure is None else _bounds(figure, ".1f", 100, "%")


def same_drafts_rows(document: dict, policy: str, dash: str = "–") -> list[tuple[str, ...]]:
    """One row per prompt set and rule of the comparison on the same drafts at one draft policy, in
    SAME_DRAFTS_HEADER's columns; the set's label ("GSM8K test, 10 of 100") on its first row."""
    sets = document.get("same_drafts_info", {}).get("sets", {})
    rows = []
    for name, rules in document.get("same_drafts", {}).get(policy, {}).items():
        for i, (rule, s) in enumerate(rules.items()):
            rank = dash if s["rank_median"] is None else f"{s['rank_median']:g}, {100 * s['top2_share']:.0f}%"
            rows.append((sets.get(name, {}).get("label", name) if i == 0 else "", rule,
                         interval_text(s["tau"], dash=dash), gain_text(s["gain"], dash),
                         share_text(s["beyond_exact"], dash), gain_text(s.get("against_method"), dash),
                         interval_text(s["target_prob"], 3, dash), rank))
    return rows


def same_drafts_caption(document: dict, policy: str) -> str:
    """What one policy's table measures, in a sentence."""
    info = document.get("same_drafts_info", {})
    return (f"On lossless SD's drafts ({info.get('policies', {}).get(policy, policy)}): each rule re-judges the "
            f"same drafts; {info.get('pooling', '')}, {info.get('interval', '')}; a rule leads or trails only "
            "where the interval of its gain excludes 0.")
