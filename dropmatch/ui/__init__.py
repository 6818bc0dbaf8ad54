"""The Gradio app as a small package: the only part of the project that imports gradio.

    layout.py     the components, one builder per tab (Ui: every component by name)
    views.py      data -> what the components show (a RunRecord, a running Comparison)
    callbacks.py  settings in, views out; the model work through the PairHost (and ZeroGPU's GPU call)
    listeners.py  every event in one place; create_demo(host) -> gr.Blocks
"""

from ..assets import page_file
from ..render import css as _render_css
from .listeners import create_demo


def css() -> str:
    """The app's stylesheet: the texts' and charts' (render.css), then the page layout's (assets/layout.css)."""
    return _render_css() + page_file("layout.css")


__all__ = ["create_demo", "css"]
