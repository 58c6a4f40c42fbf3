"""The Gradio layer of Medusa Playground: layout and handlers (ui, handlers), plotly figures
(figures), token HTML (render). The decoding itself lives in medusa_lib."""

from .ui import build_demo, launch_options

__all__ = ["build_demo", "launch_options"]
