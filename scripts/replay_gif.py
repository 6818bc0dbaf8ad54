"""The README's animated replay, made from real frames of the app's Replay tab.

    python scripts/replay_gif.py [--run 2_chat_writing] [--stages 90] [--out assets/screenshots/replay.gif]

Opens the app on a shipped recorded run (no model is loaded: a recorded run needs none), steps the
replay one stage per frame in headless Chromium (the same key a presenter's clicker sends), takes a
screenshot of the player each time and writes an optimised GIF, refusing one over --max-mb.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def frames(url: str, run: str, stages: int, width: int) -> list[bytes]:
    """PNG screenshots of the replay player, one per stage, from the first stage on."""
    from playwright.sync_api import sync_playwright

    shots = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": width, "height": 620})
        page.goto(f"{url}?run={run}&presenter=1")
        page.wait_for_selector(".dm-rp.dm-presenting", timeout=60_000)
        page.keyboard.press("-")  # presenter text a step smaller: more of the run in the frame
        for _ in range(stages):
            shots.append(page.screenshot())
            page.keyboard.press("PageDown")
        browser.close()
    return shots


def write_gif(shots: list[bytes], out: Path, frame_ms: int, scale: float) -> int:
    from PIL import Image

    images = []
    for shot in shots:
        image = Image.open(io.BytesIO(shot)).convert("RGB")
        image = image.resize((int(image.width * scale), int(image.height * scale)), Image.LANCZOS)
        images.append(image.quantize(colors=64, method=Image.Quantize.MEDIANCUT))
    durations = [frame_ms] * (len(images) - 1) + [frame_ms * 8]  # hold the last frame
    out.parent.mkdir(parents=True, exist_ok=True)
    images[0].save(out, save_all=True, append_images=images[1:], duration=durations, loop=0, optimize=True)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="2_chat_writing", help="a shipped recorded run (file name in assets/recorded)")
    parser.add_argument("--stages", type=int, default=72)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--frame-ms", type=int, default=350)
    parser.add_argument("--max-mb", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshots" / "replay.gif")
    args = parser.parse_args(argv)

    import app
    from dropmatch.pair_host import PairHost

    def no_model(spec):
        raise RuntimeError("the GIF is made from a recorded run; no model is loaded")

    demo = app.create_demo(PairHost(loader=no_model, engine_factory=lambda pair: pair))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, css=app.css())
    try:
        size = write_gif(frames(demo.local_url, args.run, args.stages, args.width), args.out, args.frame_ms, args.scale)
    finally:
        demo.close()
    print(f"wrote {args.out} ({size / 1e6:.2f} MB, {args.stages} frames)")
    if size > args.max_mb * 1e6:
        print(f"error: over {args.max_mb} MB; use fewer --stages or a smaller --scale", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
