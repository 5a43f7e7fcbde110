"""Offline passes over IR and archives: classify, lint, diff, export, summary.

None of them imports torch or CUDA, so every offline command runs anywhere.
"""
