"""Serving a Gradio demo on loopback inside the test process, and waiting for what it does."""

from __future__ import annotations

import time

import gradio

LAUNCH_TRIES = 3


def serve_locally(demo: gradio.Blocks, **launch_kwargs) -> gradio.Blocks:
    """`demo` launched on 127.0.0.1 without blocking; returns it (close it with `demo.close()`).

    Gradio's launch probes its own URL and raises when one HEAD request takes over 3 s: its probe
    retries a bad status but not a timeout. A busy CI machine can stall that long, so a failed probe
    closes the server and launches again, up to LAUNCH_TRIES times; the tests' own checks of what
    the server answers are untouched.
    """
    for attempt in range(1, LAUNCH_TRIES + 1):
        try:
            demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **launch_kwargs)
            return demo
        except ValueError as error:
            if "localhost is not accessible" not in str(error) or attempt == LAUNCH_TRIES:
                raise
            print(f"gradio's self-probe timed out (launch {attempt} of {LAUNCH_TRIES}); launching again")
            demo.close()
    raise AssertionError("unreachable")


def open_tab(page, name: str) -> None:
    """Open a tab by its label as a visitor does: its group's tab first (layout.TAB_GROUPS), then the tab."""
    from dropmatch.ui.layout import TAB_GROUPS

    group = next(label for label, _, names in TAB_GROUPS if name in names)
    page.get_by_role("tab", name=group, exact=True).click()
    page.get_by_role("tab", name=name, exact=True).click()


def wait_for(condition, timeout_s: float = 20.0, poll_s: float = 0.1) -> bool:
    """Whether `condition()` became true within `timeout_s` (asked every `poll_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


# Every element under `selector` with text of its own, visible: its colour against the first opaque
# background behind it, and the WCAG contrast ratio of the two (page.evaluate(TEXT_CONTRAST_JS, selector)).
TEXT_CONTRAST_JS = """
(selector) => {
  const lum = (rgb) => {
    const [r, g, b] = rgb.match(/[\\d.]+/g).slice(0, 3).map(Number).map((v) => v / 255)
      .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const opaque = (e) => {
    for (; e; e = e.parentElement) {
      const bg = getComputedStyle(e).backgroundColor;
      if (bg !== "rgba(0, 0, 0, 0)" && bg !== "transparent") return bg;
    }
    return "rgb(255, 255, 255)";
  };
  const own = (e) => [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
  return [...document.querySelectorAll(selector + ' *')].filter((e) => e.offsetParent !== null && own(e)).map((e) => {
    const [a, b] = [lum(getComputedStyle(e).color), lum(opaque(e))];
    return {tag: e.tagName, cls: e.className, text: e.textContent.slice(0, 30), ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)};
  });
}
"""


def assert_no_horizontal_scroll(page) -> None:
    """The page is no wider than its viewport (a phone-width viewport scrolls only down)."""
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), \
        page.evaluate("document.documentElement.scrollWidth")


def assert_contrast(found: list[dict], minimum: float = 4.5) -> None:
    """Every element TEXT_CONTRAST_JS found meets `minimum` (WCAG AA for text: 4.5)."""
    worst = min(found, key=lambda item: item["ratio"])
    assert worst["ratio"] >= minimum, worst
