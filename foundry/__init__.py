"""Foundry: persist the CUDA graphs an engine captures and restore them in a fresh process.

Offline parts (``graphir``, ``archive``, ``backends``, ``inspect``, the CLI and the TUI) run
without a GPU; GPU parts import NVIDIA's ``cuda-bindings`` lazily.
"""

__version__ = "0.1.0"
