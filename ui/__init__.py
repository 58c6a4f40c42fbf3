"""The Gradio layer of Medusa Playground: layout and handlers (ui, handlers), plotly figures
(figures), token HTML (render). The decoding itself lives in medusa_lib."""

from .live import DeviceTurn
from .serve import serve
from .ui import build_demo, launch_options

__all__ = ["DeviceTurn", "build_demo", "launch_options", "serve"]
