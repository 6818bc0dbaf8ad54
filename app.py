"""DropMatch Studio: lossless speculative decoding and DropMatch side by side.

    python app.py            # the embedded CPU pair; host and port from GRADIO_SERVER_NAME / _PORT
    python app.py --port 8080 --share

What a Space needs at the top level: build the demo over a PairHost (the one loaded pair, which
starts loading in the background at launch) and launch it. The UI itself is dropmatch/ui/;
nothing heavy happens at import time.
"""

from __future__ import annotations

import argparse
import importlib.util

if importlib.util.find_spec("spaces") is not None:  # ZeroGPU: `spaces` comes before anything imports torch
    importlib.import_module("spaces")

from dropmatch.assets import EXAMPLES_FILE
from dropmatch.runfile import MAX_RUN_FILE_BYTES, Downloads
from dropmatch.ui import create_demo, css
from dropmatch.ui.sessions import cap_malloc_arenas

__all__ = ["EXAMPLES_FILE", "create_demo", "css", "main"]


def main() -> None:
    parser = argparse.ArgumentParser(description="DropMatch Studio")
    parser.add_argument("--host", default=None, help="default: $GRADIO_SERVER_NAME, else 127.0.0.1")
    parser.add_argument("--port", type=int, default=None, help="default: $GRADIO_SERVER_PORT, else 7860")
    parser.add_argument("--share", action="store_true")
    args = parser.parse_args()
    cap_malloc_arenas()  # before the model thread and Gradio's workers start: a flat server's memory
    from dropmatch.decoding.config import DEFAULTS, PRESETS
    from dropmatch.decoding.engine import Engine
    from dropmatch.models import load_pair
    from dropmatch.pair_host import Policy, PairHost
    from dropmatch.ui import zerogpu

    inline = zerogpu.active()
    host = PairHost(load_pair, Engine, Policy.from_env(), inline=inline)
    if inline:  # the default pair loads (to "cuda") in this process, before launch
        zerogpu.start(host, PRESETS[DEFAULTS.pair])
    downloads = Downloads()
    try:
        demo = create_demo(host, downloads)
        # None lets Gradio read GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, as a Space sets them.
        demo.launch(server_name=args.host, server_port=args.port, share=args.share, css=css(),
                    max_file_size=MAX_RUN_FILE_BYTES, prevent_thread_lock=True)
        if not inline:
            # Only now: launch probes its own URL and gives up on one HEAD slower than 3 s, which
            # a slow CPU converting the embedded GGUF in the background can make it.
            host.preload(PRESETS[DEFAULTS.pair])
        demo.block_thread()
    finally:
        downloads.close()


if __name__ == "__main__":
    main()
