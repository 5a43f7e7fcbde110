"""``foundry run``: the launcher that starts a program under the hook, and the later
runs of a SAVE (one process, or one per rank) with the merging of their marks."""
