"""Passes over one IR, or over two captures of the same program: definedness marks,
graph diff, export.

None of them imports torch or CUDA, so every offline command runs anywhere.
"""
