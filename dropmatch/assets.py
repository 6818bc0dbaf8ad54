"""Where the files shipped with the project live (prompts, results, recorded runs, How it works, the page's
scripts, styles and tab notes, the report page)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_FILE = ROOT / "assets" / "prompts" / "examples.json"
FRONTIER_FILE = ROOT / "assets" / "results" / "frontier.json"
ROBUSTNESS_FILE = ROOT / "assets" / "results" / "robustness.json"
ROBUSTNESS_LONG_DRAFT_FILE = ROOT / "assets" / "results" / "robustness_gamma15.json"  # FLy's authors' draft length
SAME_DRAFTS_FILE = ROOT / "assets" / "results" / "same_drafts.json"
RECORDED_DIR = ROOT / "assets" / "recorded"
HOW_IT_WORKS_FILE = ROOT / "docs" / "how_it_works.md"
TAB_NOTES_FILE = ROOT / "assets" / "tab_notes.md"
LESSONS_DIR = ROOT / "assets" / "lessons"  # the built-in lessons (builtin_lessons.py)
PAGE_FILES = {name: ROOT / "assets" / name for name in ("render.css", "layout.css", "replay.js", "theme.js",
                                                        "toy_head.js", "lessons.js", "popover.js", "clamp.js")}
REPORT_TEMPLATE = ROOT / "assets" / "report.html"  # the benchmark report page (bench/report.py; not on the Space)


def load_examples() -> list[dict]:
    """The example prompts (prompt, category) the app offers; [] where the file is missing."""
    return json.loads(EXAMPLES_FILE.read_text(encoding="utf-8")) if EXAMPLES_FILE.exists() else []


def load_frontier(path: Path = FRONTIER_FILE) -> dict | None:
    """The shipped benchmark document with a frontier (bench --frontier), or None."""
    document = load_robustness(path)
    return document if document and document.get("frontier") else None


def load_same_drafts(path: Path = SAME_DRAFTS_FILE) -> dict | None:
    """The shipped comparison on the same drafts (scripts/merge_same_drafts.py), or None."""
    return load_robustness(path)


def load_robustness(path: Path = ROBUSTNESS_FILE) -> dict | None:
    """The shipped robustness experiment (a benchmark document with the judge rules), or None."""
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def how_it_works() -> str:
    """The method, the rules and the metrics in Markdown with $...$ formulas (docs/how_it_works.md)."""
    if not HOW_IT_WORKS_FILE.exists():
        return "docs/how_it_works.md is missing from this installation."
    text = HOW_IT_WORKS_FILE.read_text(encoding="utf-8")
    return text.split("\n", 1)[1].lstrip() if text.startswith("# ") else text  # the tab names it already


def tab_note(tab: str) -> str:
    """The Markdown note under a tab of the page: its `## <tab>` section of assets/tab_notes.md."""
    sections = TAB_NOTES_FILE.read_text(encoding="utf-8").split("\n## ")[1:]
    return next(body.strip() for head, _, body in (section.partition("\n") for section in sections) if head == tab)


def page_file(name: str) -> str:
    """A file the page loads, read when the page is built: a stylesheet, or a script Gradio runs as a component's
    js_on_load (`element` is the component). replay.js: the replay player; theme.js: charts follow the page's
    theme; toy_head.js: the toy head; lessons.js: the lesson player; popover.js, clamp.js: the texts' popovers
    and the settings' clamp notes; render.css, layout.css: the texts' and the page's styles."""
    return PAGE_FILES[name].read_text(encoding="utf-8")
