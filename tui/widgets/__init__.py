"""Widgets of the Foundry TUI, one per file, each with the messages it posts."""
