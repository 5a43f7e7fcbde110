"""``foundry-tui``: browse an archive (ranks -> graphs -> nodes) or diff two.

The App (``app.py``) is thin: it parses arguments, opens the archives before
any screen starts (so a bad path is one line on stderr, exit 2) and pushes one
screen. Screens live one per file in ``screens/``, widgets in ``widgets/``,
styles in ``foundry.tcss``. Everything slow (decoding a graph, summary, lint,
diff) runs in workers; the passes come from :mod:`foundry.graphir.passes` and
the TUI only renders what they return. Design notes: ``docs/tui.md``.
"""
