"""Drive the app in a real headless Chromium: the shipped run's rule lab on first visit, then pick an
example, Run, wait, open every tab, move a rule-lab control, take screenshots.

To refresh the README's pictures (starts the app on the embedded pair itself):
    python scripts/ui_flow.py --out assets/screenshots
tests/test_browser.py drives its own app with it: --url URL (an app already running) and --json FILE
(what the page showed). Needs Debian's chromium at /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def open_tab(page, name: str) -> None:
    """Open a tab by its label as a visitor does: its group's tab first (layout.TAB_GROUPS), then the tab."""
    from dropmatch.ui.layout import TAB_GROUPS

    group = next(label for label, _, names in TAB_GROUPS if name in names)
    page.get_by_role("tab", name=group, exact=True).click()
    page.get_by_role("tab", name=name, exact=True).click()


def drive(url: str, out_dir: Path, example_prefix: str, max_new_tokens: int = 48, timeout_s: float = 300) -> dict:
    """Returns what the page showed: token counts per column, number of charts, status, file paths."""
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000}, device_scale_factor=1)
        page.goto(url)
        found = {"recorded_lab_rows": _first_visit_lab_rows(page)}
        found.update(_run_example(page, example_prefix, max_new_tokens, timeout_s))
        shots = {name: out_dir / f"{name}.png" for name in ("main", "step", "tradeoffs", "lab")}
        page.screenshot(path=str(shots["main"]), full_page=True)
        open_tab(page, "Step through")
        page.wait_for_selector("#step-view .dm-step", timeout=30_000)
        found["step_text"] = page.inner_text("#step-view")
        page.locator("#step-view").screenshot(path=str(shots["step"]))
        open_tab(page, "Trade-offs")
        page.wait_for_selector("#plot-tradeoff .js-plotly-plot", timeout=30_000)
        page.wait_for_timeout(1000)
        found["tradeoff_text"] = page.inner_text("#plot-tradeoff")
        page.locator("#plot-tradeoff").screenshot(path=str(shots["tradeoffs"]))
        found.update(_rule_lab(page))
        page.locator("#lab-tab").screenshot(path=str(shots["lab"]))
        browser.close()
    found["screenshots"] = [str(path) for path in shots.values()]
    return found


def _first_visit_lab_rows(page) -> int:
    """Rows of the rule lab of the shipped run shown on first visit, before the user's own run (a Run
    cancels it if it is late); 0 when there is none."""
    try:
        page.wait_for_function("() => /recorded run/i.test(document.querySelector('#status')?.innerText || '')",
                               timeout=15_000)
        open_tab(page, "Rule lab")
        page.wait_for_selector("#lab-matrix table", timeout=15_000)
        rows = page.locator("#lab-matrix tr").count() - 1
        open_tab(page, "Charts")
        return rows
    except Exception:  # noqa: BLE001 - no shipped runs: nothing to wait for
        return 0


def _run_example(page, example_prefix: str, max_new_tokens: int, timeout_s: float) -> dict:
    """Click the example, set max new tokens, Run, and read both columns once the status says done."""
    page.get_by_text(example_prefix).first.click()
    tokens_box = page.get_by_label("max new tokens", exact=False).first
    if not tokens_box.is_visible():  # the Settings accordion starts closed
        page.locator("#settings").get_by_text("Settings").first.click()
    tokens_box.fill(str(max_new_tokens))
    tokens_box.press("Enter")
    page.click("#method-button")  # the paper's own settings, one click away
    page.wait_for_function("() => /the paper's own/.test(document.querySelector('#status').innerText)")
    method = {"method_p": page.get_by_label("p (dropout rate)", exact=False).first.input_value(),
              "method_k": page.get_by_label("K (paths)", exact=False).first.input_value()}
    page.click("#run-button")
    page.wait_for_function(
        "() => { const s = document.querySelector('#status'); return s && /Done|⚠️/.test(s.innerText); }",
        timeout=timeout_s * 1000,
    )
    page.wait_for_timeout(1500)  # let Plotly finish drawing
    return {
        **method,
        "status": page.inner_text("#status"),
        "lossless_tokens": page.locator("#lossless-text .dm-tok").count(),
        "lossy_tokens": page.locator("#lossy-text .dm-tok").count(),
        "charts": page.locator(".js-plotly-plot").count(),
        "lossless_stats": page.inner_text("#lossless-stats"),
        "lossy_stats": page.inner_text("#lossy-stats"),
        "verdict": page.inner_text("#verdict"),
    }


def _rule_lab(page) -> dict:
    """The run's rule lab: its rows, a re-judge at p = 0.25, and the disagreements filter."""
    open_tab(page, "Rule lab")
    page.wait_for_selector("#lab-matrix table", timeout=30_000)
    found = {"lab_rows": page.locator("#lab-matrix tr").count() - 1}
    p_box = page.locator("#lab-p input[type=number]")
    p_box.fill("0.25")
    p_box.press("Enter")
    page.wait_for_function("() => /Re-judged/.test(document.querySelector('#lab-status')?.innerText || '')",
                           timeout=60_000)
    found["lab_status"] = page.inner_text("#lab-status")
    found["lab_summary"] = page.inner_text("#lab-summary")
    page.locator("#lab-disagreements input").check()
    page.wait_for_timeout(1000)
    found["lab_disagreement_rows"] = page.locator("#lab-matrix tr").count() - 1
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="assets/screenshots")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--url", help="drive the app running there (default: start one on the embedded pair)")
    parser.add_argument("--json", help="write what the page showed to this file")
    args = parser.parse_args()
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # app.py, run from anywhere
    import app

    example = json.loads(app.EXAMPLES_FILE.read_text())[0]["prompt"][:40]
    demo = None
    if args.url is None:
        from dropmatch.decoding.engine import Engine
        from dropmatch.models import load_pair
        from dropmatch.pair_host import Policy, PairHost

        demo = app.create_demo(PairHost(load_pair, Engine, Policy()))
        demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, css=app.css())
    try:
        found = drive(args.url or demo.local_url, Path(args.out), example, args.max_new_tokens)
    finally:
        if demo is not None:
            demo.close()
    print(found)
    if args.json:
        Path(args.json).write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
