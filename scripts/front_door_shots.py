"""Screenshots of the front door on the embedded pair, in a real Chromium: the first view (a recorded
run), a finished live run, a pinned token's popover, and the first view at 390 px (a phone).

    python scripts/front_door_shots.py [--out assets/screenshots]

Starts `python app.py` on a free port (the embedded pair, offline), runs the prompt below live with the
default settings, and writes front_first.png, front_live.png, front_popover.png, front_phone.png.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from first_click import CHROMIUM, ROOT, free_port, wait_until_listening

PROMPT = "Explain why the sky is blue in two sentences."


def shoot(out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url, written = f"http://127.0.0.1:{port}/", []
    try:
        wait_until_listening(url, server)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=1)
            phone.goto(url)
            phone.wait_for_selector("#status")
            phone.wait_for_function("() => /recorded run/.test(document.querySelector('#status').innerText)",
                                    timeout=120_000)
            written.append(_save(phone, out / "front_phone.png"))
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url)
            page.wait_for_selector("#status")
            page.wait_for_function("() => /is loaded/.test(document.querySelector('#status').innerText)",
                                   timeout=300_000)
            written.append(_save(page, out / "front_first.png"))
            page.locator("#prompt textarea").fill(PROMPT)
            page.locator("#run-button").click()
            page.wait_for_function("() => /^Done/.test(document.querySelector('#status').innerText)", timeout=300_000)
            page.locator("#verdict").scroll_into_view_if_needed()
            written.append(_save(page, out / "front_live.png"))
            lossy = page.locator("#lossy-text")
            page.evaluate("() => window.scrollTo(0, document.querySelector('#lossy-text').getBoundingClientRect().top"
                          " + window.scrollY - 120)")
            accepted = lossy.locator(".dm-tok.dm-js, .dm-tok.dm-majority").first
            (accepted if accepted.count() else lossy.locator(".dm-tok").nth(3)).click()
            written.append(_save(page, out / "front_popover.png"))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return written


def _save(page, path: Path) -> Path:
    page.screenshot(path=str(path))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "assets" / "screenshots"))
    args = parser.parse_args()
    for path in shoot(Path(args.out)):
        print(f"wrote {path} ({path.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
