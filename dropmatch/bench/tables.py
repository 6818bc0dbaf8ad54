"""The rows of a benchmark's results table, shared by the CLI's text table, the HTML report and the
README's Markdown table (pure: summary dicts in, strings out)."""

from __future__ import annotations

HEADER = ("run", "tau", "accept", "tok/s", "vs AR", "vs lossless", "MC share", "p", "accuracy", "NLL", "off-nucleus",
          "dist-2", "Δ NLL", "Δ off-nucleus", "Δ dist-2", "band", "overlap w/ lossless")


def percent(value, dash: str = "–") -> str:
    return dash if value is None else f"{100 * value:.1f}%"


def number(value, digits: int = 2, dash: str = "–") -> str:
    return dash if value is None else f"{value:.{digits}f}"


def summary_rows(summary: dict, dash: str = "–", peer: bool = True) -> list[tuple[str, ...]]:
    """One row per run of one benchmark's summary (bench.summarize_benchmark), in HEADER's columns:
    the autoregressive baseline, each rule, then each peer (when there are any and `peer`)."""
    def f(value, digits: int = 2) -> str:
        return number(value, digits, dash)

    ar = summary["autoregressive"]
    none = (dash,) * 4  # no deltas, no band
    rows = [("autoregressive", "1.00", dash, f(ar["tokens_per_s"], 1), "1.00x", dash, dash, dash,
             f(ar.get("accuracy"), 3), f(ar.get("target_nll"), 3), percent(ar.get("off_nucleus_rate"), dash),
             f(ar.get("distinct2"), 3), *none, dash)]
    reference = summary.get("reference", {}).get("target_sampled")
    if reference:
        rows.append((f"target sampled (T {reference['temperature']:g}, top-p {reference['top_p']:g}; reference)",
                     dash, dash, dash, dash, dash, dash, dash, f(reference.get("accuracy"), 3),
                     f(reference["target_nll"], 3), percent(reference["off_nucleus_rate"], dash),
                     f(reference.get("distinct2"), 3), *none, dash))
    for label, s in summary["rules"].items():
        share = dash if s["mc_overhead"] is None else f"{100 * s['mc_overhead']:.1f}%"
        rows.append((label, f(s["tau"]), f(s["acceptance_rate"]), f(s["tokens_per_s"], 1),
                     f(s["speedup_vs_ar"]) + "x", f(s.get("speedup_vs_lossless")) + "x", share, f(s["p"], 3),
                     f(s["accuracy"], 3), f(s["target_nll"], 3), percent(s.get("off_nucleus_rate"), dash),
                     f(s["distinct2"], 3), signed(s.get("delta_target_nll"), 3, dash),
                     signed_points(s.get("delta_off_nucleus_rate"), dash), signed(s.get("delta_distinct2"), 3, dash),
                     band_text(s.get("band"), dash), f(s.get("overlap_with_lossless"), 3)))
    for shown in (summary.get("peers", {}).values() if peer else ()):
        rows.append((shown["name"], dash, dash, f(shown["tokens_per_s"], 1), dash,
                     f"ours/peer {f(shown['ours_over_peer'])}", dash, dash, dash, dash, dash, dash, *none, dash))
    return rows


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
    def f(value, digits: int = 2) -> str:
        return number(value, digits, dash)

    rows = []
    for category, part in summary.get("categories", {}).items():
        rows.append((category, str(part["prompts"]), "autoregressive", "1.00", dash,
                     f(part["autoregressive"]["tokens_per_s"], 1), "1.00x"))
        rows += [("", "", label, f(s["tau"]), f(s["acceptance_rate"]), f(s["tokens_per_s"], 1),
                  f(s["speedup_vs_ar"]) + "x") for label, s in part["rules"].items()]
    return rows
