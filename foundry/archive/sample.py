"""The sample archive shipped inside the package: a tiny Qwen3 captured on an H200."""

from __future__ import annotations

from pathlib import Path

SAMPLE_NAME = "@sample"


def sample_path() -> Path:
    """Where the bundled sample archive lives on disk."""
    from importlib.resources import files  # imported here: most commands never name the sample

    return Path(str(files("foundry") / "samples" / "tiny-qwen3"))


def resolve_archive_arg(text: str) -> Path:
    """An archive argument: a path, or ``@sample`` for the bundled sample."""
    return sample_path() if text == SAMPLE_NAME else Path(text)
