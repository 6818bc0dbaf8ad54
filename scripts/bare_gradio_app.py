"""A bare Gradio app of the Studio's shape, for scripts/soak_server.py --bare: the same layout, the same
events (page load, Run, /compare), answering with a shipped run's views instead of running models,
and no SessionJanitor unless --janitor. What its memory does over many visitors is Gradio's own
per-session bookkeeping for a page of this shape.

    python scripts/bare_gradio_app.py [--janitor]     # host and port from GRADIO_SERVER_NAME / _PORT
"""

from __future__ import annotations

import argparse

import gradio as gr

from dropmatch.decoding.config import Settings
from dropmatch.runfile import Downloads, recorded_runs
from dropmatch.ui import callbacks, css
from dropmatch.ui.layout import build_layout
from dropmatch.ui.sessions import SessionJanitor


def build(janitor: bool) -> gr.Blocks:
    downloads = Downloads()
    title, path = next(iter(recorded_runs().items()))
    view = callbacks.open_recorded(downloads, path, title, shipped=True)
    with gr.Blocks(title="bare") as demo:
        ui = build_layout()
        keeper = SessionJanitor(demo) if janitor else None

        def on_load(request: gr.Request):
            if keeper:
                keeper.page_opened(request.session_hash)
            return ui.bind(dict(view))

        def on_closed(request: gr.Request):
            if keeper:
                keeper.page_closed(request.session_hash)

        def compare(prompt: str, max_new_tokens: int = 6) -> dict:
            if keeper:
                keeper.sweep()
            return {"prompt": prompt, "lossless": view.get("lossless_out"), "lossy": view.get("lossy_out")}

        demo.load(on_load, None, ui.view_components())
        demo.unload(on_closed)
        ui.run_button.click(lambda *values: ui.bind(dict(view)), ui.setting_components(), ui.view_components())
        gr.api(compare, api_name="compare")
    demo.queue(default_concurrency_limit=8)
    return demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--janitor", action="store_true", help="drop closed tabs' and idle API clients' sessions")
    args = parser.parse_args()
    Settings()  # the same imports as the app's, loaded before the first visit
    build(args.janitor).launch(css=css())


if __name__ == "__main__":
    main()
