"""Analyses of whole archives, above ``archive/`` and ``backends/``: lint, summary,
archive diff, the relocation check, and the rendering of their reports.

None of them imports torch or CUDA, so every offline command runs anywhere.
"""
