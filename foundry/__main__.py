"""``python -m foundry`` is the ``foundry`` command."""

from foundry.cli import main

main()
