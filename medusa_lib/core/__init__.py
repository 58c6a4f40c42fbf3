"""The engine: Medusa trees, heads, the decoders and their step records, model loading and CPU attention/packing.
Imports nothing outside core/ (and never gradio)."""
