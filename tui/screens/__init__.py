"""Screens of the Foundry TUI, one per file."""
